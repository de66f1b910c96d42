// The engine test rig (tests/unit/engine_*_test.cc): an Engine built by the test (no thread, no
// socket, no device), one protected QP whose peer is in this process (its messages land in
// Engine::local_inbox, where the test reads them), and a FAKE provider that records every
// modify_qp and post_send and completes nothing. Each test file includes it once (its fakes
// live in an anonymous namespace: one copy per test file).
#pragma once

#include <catch2/catch.hpp>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <variant>
#include <vector>

#include "core/failover/engine_state.h"
#include "core/failover/message_dispatch.h"
#include "core/failover/pairing.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_switch.h"
#include "core/failover/port_events.h"
#include "core/failover/qp_lifecycle.h"
#include "core/failover/qp_transitions.h"

namespace {

using vf::failover::Engine;
using vf::failover::Protection;

struct ModifyCall {
  ibv_qp* qp;
  ibv_qp_state state;
  int mask;
  ibv_qp_attr attr;
};
std::vector<ModifyCall> g_modifies;

// A move of this QP to this state is refused with EINVAL (not recorded); none when null.
ibv_qp* g_refused_qp = nullptr;
ibv_qp_state g_refused_state = IBV_QPS_RTS;

int fake_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if ((mask & IBV_QP_STATE) && qp == g_refused_qp && attr->qp_state == g_refused_state) {
    return EINVAL;
  }
  if (mask & IBV_QP_STATE) g_modifies.push_back({qp, attr->qp_state, mask, *attr});
  return 0;
}
int fake_poll_cq(ibv_cq*, int, ibv_wc*) {
  return 0;
}
struct PostCall {
  ibv_qp* qp;
  std::uint64_t wr_id;
  ibv_wr_opcode opcode;  // of a request (a receive's: IBV_WR_SEND)
  int num_sge;
  unsigned int send_flags;
};
std::vector<PostCall> g_posts;
std::vector<PostCall> g_recv_posts;
// A QP the engine moved to ERR takes no receive (so no drain marker: the drain takes what the
// empty CQ holds); any other records it.
int fake_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  for (auto call = g_modifies.rbegin(); call != g_modifies.rend(); ++call) {
    if (call->qp != qp) continue;
    if (call->state == IBV_QPS_ERR) {
      *bad = wr;
      return ENOSYS;
    }
    break;
  }
  for (; wr != nullptr; wr = wr->next) g_recv_posts.push_back({qp, wr->wr_id, IBV_WR_SEND, wr->num_sge, 0});
  return 0;
}
// A request of this opcode is refused with EINVAL (as a device without memory windows refuses
// BIND_MW); none when -1. Every other request is recorded.
int g_refused_opcode = -1;
int fake_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  for (; wr != nullptr; wr = wr->next) {
    if (static_cast<int>(wr->opcode) == g_refused_opcode) {
      *bad = wr;
      return EINVAL;
    }
    g_posts.push_back({qp, wr->wr_id, wr->opcode, wr->num_sge, wr->send_flags});
  }
  return 0;
}
// Each device's GID table (empty slots all zeros, as ibv_query_gid reports them; an index beyond
// the table is an error). The Rig puts each path's GID at index 0; a test may move them.
constexpr int kRigGidTableLen = 8;
std::array<vf::Gid, kRigGidTableLen> g_gid_tables[2];
// Each slot's type (IBV_GID_TYPE_*), -1 when the device does not say (no ibv_query_gid_ex).
std::array<int, kRigGidTableLen> g_gid_types[2];
const ibv_context* g_rig_contexts = nullptr;
int fake_query_gid(ibv_context* context, uint8_t, int index, ibv_gid* gid) {
  if (index < 0 || index >= kRigGidTableLen) return -1;
  const int device = g_rig_contexts != nullptr && context == &g_rig_contexts[1] ? 1 : 0;
  std::memcpy(gid->raw, g_gid_tables[device][index].data(), sizeof gid->raw);
  return 0;
}
int fake_query_gid_type(ibv_context* context, uint8_t, int index, int* type) {
  if (index < 0 || index >= kRigGidTableLen) return EINVAL;
  const int device = g_rig_contexts != nullptr && context == &g_rig_contexts[1] ? 1 : 0;
  if (g_gid_types[device][index] < 0) return EOPNOTSUPP;
  *type = g_gid_types[device][index];
  return 0;
}
ibv_port_state g_port_state = IBV_PORT_ACTIVE;  // what every port says when asked
int fake_query_port(ibv_context*, uint8_t, ibv_port_attr* attr) {
  *attr = {};
  attr->state = g_port_state;
  return 0;
}
ibv_context_ops g_ops = [] {
  ibv_context_ops ops{};
  ops.poll_cq = fake_poll_cq;
  ops.post_recv = fake_post_recv;
  ops.post_send = fake_post_send;
  return ops;
}();
const ibv_context_ops* fake_provider_ops(ibv_context*) {
  return &g_ops;
}

vf::Gid gid(std::uint8_t last) {
  vf::Gid g{};
  g[10] = 0xff;
  g[11] = 0xff;
  g[15] = last;
  return g;
}

// Every registration has the same lkey on the standby device (the rig mirrors nothing).
bool same_lkey(int, std::uint32_t lkey, std::uint32_t* out) {
  *out = lkey;
  return true;
}

// fake0/1 backed up by fake1/1; the application's QP 17 on fake0 with its standby 18 on fake1,
// paired with QP 33 of this process, traffic on the primary, both paths connected.
struct Rig {
  std::unique_ptr<Engine> e = std::make_unique<Engine>();
  ibv_context contexts[2]{};
  ibv_qp app_qp{};
  ibv_qp standby_qp{};
  ibv_cq cq{};
  ibv_cq shadow_cq{};  // the CQ's shadow on fake1
  std::unique_ptr<vf::CqState> cq_state;
  vf::VirtualQp* v = nullptr;
  Protection* p = nullptr;

  vf::DatapathServices saved_services = vf::datapath_services();

  Rig() {
    vf::DatapathServices services = saved_services;
    services.translate_lkey = same_lkey;
    vf::set_datapath_services(services);
    g_modifies.clear();
    g_posts.clear();
    g_recv_posts.clear();
    g_refused_qp = nullptr;
    g_refused_opcode = -1;
    g_port_state = IBV_PORT_ACTIVE;
    g_rig_contexts = contexts;
    g_gid_tables[0] = {};
    g_gid_tables[1] = {};
    g_gid_tables[0][0] = gid(1);
    g_gid_tables[1][0] = gid(2);
    g_gid_types[0].fill(-1);
    g_gid_types[1].fill(-1);
    e->verbs.modify_qp = fake_modify_qp;
    e->verbs.query_port = fake_query_port;
    e->verbs.query_gid = fake_query_gid;
    e->verbs.query_gid_type = fake_query_gid_type;
    e->verbs.provider_ops = fake_provider_ops;
    e->configured = e->started = true;
    e->token = 1;
    e->device_count = 2;
    for (int i = 0; i < 2; ++i) {
      e->devices[i].name = i == 0 ? "fake0" : "fake1";
      e->devices[i].context = &contexts[i];
      contexts[i].ops = g_ops;
      e->devices[i].port_count = 1;
      e->devices[i].ports[1].state = IBV_PORT_ACTIVE;
    }
    e->devices[0].ports[1].backup_device = 1;
    app_qp.qp_num = 17;
    app_qp.context = &contexts[0];
    app_qp.state = IBV_QPS_RTS;
    standby_qp.qp_num = 18;
    standby_qp.context = &contexts[1];
    cq.context = &contexts[0];
    cq.cqe = 64;
    cq_state = std::make_unique<vf::CqState>(&cq, 0, &g_ops, 2 * 64 + 64);
    shadow_cq.context = &contexts[1];
    shadow_cq.cqe = 64;
    cq_state->shadow = &shadow_cq;
    cq_state->shadow_device_index = 1;
    p = &add_protected_qp(&app_qp, &standby_qp, cq_state.get(), {33, gid(3)}, 100, 200);
    v = p->qp.get();
  }

  // A protected QP of fake0 (app_qp, 16 requests and receives of one SGE) with its standby on
  // fake1 on `cq`, both paths connected (with these PSNs), paired with `remote` in this process.
  Protection& add_protected_qp(ibv_qp* app, ibv_qp* standby, vf::CqState* cq, vf::QpKey remote,
                               std::uint32_t primary_psn, std::uint32_t standby_psn) {
    ibv_qp_cap cap{};
    cap.max_send_wr = cap.max_recv_wr = 16;
    cap.max_send_sge = cap.max_recv_sge = 1;
    cap.max_inline_data = 64;
    auto qp = std::make_unique<vf::VirtualQp>(app, &g_ops, cap, false, cq, cq);
    vf::VirtualQp* added = qp.get();
    // PhysicalPath holds atomics (no assignment): field by field, both paths connected.
    const auto connect = [](vf::PhysicalPath& path, ibv_qp* qp, int device, vf::Gid g,
                            std::uint32_t psn) {
      path.qp = qp;
      path.device_index = device;
      path.port = 1;
      path.gid_index = 0;
      path.gid = g;
      path.psn = psn;
      path.connected = true;
      path.failed = false;
    };
    connect(added->path[vf::kPrimary], app, 0, gid(1), primary_psn);
    connect(added->path[vf::kStandby], standby, 1, gid(2), standby_psn);
    Protection& protection = e->protections[added];
    protection.qp = std::move(qp);
    protection.local = {app->qp_num, gid(1)};
    protection.remote = remote;
    protection.remote_known = true;
    protection.paired = true;
    protection.peer.local = true;
    return protection;
  }

  ~Rig() {
    vf::set_datapath_services(saved_services);
    g_rig_contexts = nullptr;
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  // One inline SEND (a receive-consuming message), posted as the application would.
  void post_send(std::uint64_t wr_id, bool signaled = true) {
    char payload[8] = "message";
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(payload), sizeof payload, 0};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE | (signaled ? IBV_SEND_SIGNALED : 0);
    ibv_send_wr* bad = nullptr;
    REQUIRE(v->post_send(&wr, &bad) == 0);
  }

  // One receive of 8 bytes as the application posts it, to `post` (a QP's or an SRQ's).
  template <typename Post>
  static int post_one_receive(std::uint64_t wr_id, Post&& post) {
    static char buffer[8];
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer), sizeof buffer, 0};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return post(&wr, &bad);
  }
  void post_recv(std::uint64_t wr_id) {
    REQUIRE(post_one_receive(wr_id, [&](ibv_recv_wr* wr, ibv_recv_wr** bad) {
              return v->post_recv(wr, bad);
            }) == 0);
  }

  vf::FailoverRequest request_from_peer(std::uint32_t epoch) const {
    vf::FailoverRequest request;
    request.local = p->remote;  // the sender's view: its QP, then ours
    request.remote = p->local;
    request.epoch = epoch;
    request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kPortDown);
    request.target_path = vf::kStandby;
    return request;
  }
  // The peer's port went down: the pair runs on the standby; then the primary is re-armed (the
  // state a failback starts from).
  void fail_over_and_rearm() {
    deliver(request_from_peer(1));
    REQUIRE(v->active_path() == vf::kStandby);
    REQUIRE_FALSE(p->sw.in_progress);
    v->path[vf::kPrimary].connected = true;
    v->path[vf::kPrimary].failed = false;
    p->rearm[vf::kPrimary] = {};
  }
  // The peer's failback (its primary re-armed, both sides back to it).
  vf::FailoverRequest failback_request_from_peer(std::uint32_t epoch) const {
    vf::FailoverRequest request = request_from_peer(epoch);
    request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kFailback);
    request.target_path = vf::kPrimary;
    return request;
  }
  void deliver(const vf::FailoverRequest& m) {
    vf::failover::handle_failover(*e, m.remote, m.delivered_messages, m.epoch, m.target_path, true,
                                  static_cast<vf::FailoverReason>(m.reason));
  }
  // The peer's request to re-arm one path (its QP 33 on that path), as its shim sends it.
  vf::Rearm rearm_from_peer(int path, std::uint32_t nonce) const {
    vf::Rearm request;
    request.local = p->remote;
    request.remote = p->local;
    request.path = static_cast<std::uint8_t>(path);
    request.nonce = nonce;
    request.qpn = 33;
    request.gid = gid(3);
    return request;
  }
  // Any message of the peer (this process's: the rig's peer is local), through the dispatcher.
  void receive(vf::ControlMessage message) {
    vf::failover::PeerRef from;
    from.local = true;
    vf::failover::process_message(*e, from, 0, message);
  }
  template <typename Message>
  std::vector<Message> sent() const {
    std::vector<Message> out;
    for (const auto& [token, message] : e->local_inbox) {
      if (const auto* m = std::get_if<Message>(&message)) out.push_back(*m);
    }
    return out;
  }
};

}  // namespace
