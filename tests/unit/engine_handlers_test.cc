// The failover engine's rooms (core/failover/) driven one handler at a time: an Engine built by
// the test (no thread, no socket, no device), one protected QP whose peer is in this process (its
// messages land in Engine::local_inbox, where the test reads them), and a FAKE provider that
// records every modify_qp and completes nothing. Each case hands one crafted message or event to
// the function that owns it and checks the state it changed, and what it left alone.
#include <catch2/catch.hpp>
#include <cerrno>
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

int fake_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (mask & IBV_QP_STATE) g_modifies.push_back({qp, attr->qp_state, mask, *attr});
  return 0;
}
int fake_poll_cq(ibv_cq*, int, ibv_wc*) {
  return 0;
}
int fake_post_recv(ibv_qp*, ibv_recv_wr*, ibv_recv_wr** bad) {
  *bad = nullptr;
  return ENOSYS;  // no drain marker: the drain takes what the (empty) CQ holds
}
struct PostCall {
  ibv_qp* qp;
  std::uint64_t wr_id;
};
std::vector<PostCall> g_posts;
int fake_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr**) {
  for (; wr != nullptr; wr = wr->next) g_posts.push_back({qp, wr->wr_id});
  return 0;
}
int fake_query_gid(ibv_context*, uint8_t, int index, ibv_gid* gid) {
  *gid = {};
  gid->raw[15] = static_cast<std::uint8_t>(index + 1);
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

  Rig() {
    g_modifies.clear();
    g_posts.clear();
    g_port_state = IBV_PORT_ACTIVE;
    e->verbs.modify_qp = fake_modify_qp;
    e->verbs.query_port = fake_query_port;
    e->verbs.query_gid = fake_query_gid;
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
    ibv_qp_cap cap{};
    cap.max_send_wr = cap.max_recv_wr = 16;
    cap.max_send_sge = cap.max_recv_sge = 1;
    cap.max_inline_data = 64;
    auto qp = std::make_unique<vf::VirtualQp>(&app_qp, &g_ops, cap, false, cq_state.get(),
                                              cq_state.get());
    v = qp.get();
    v->path[vf::kPrimary] = {&app_qp, 0, 1, 0, gid(1), 100, true, false};
    v->path[vf::kStandby] = {&standby_qp, 1, 1, 0, gid(2), 200, true, false};
    p = &e->protections[v];
    p->qp = std::move(qp);
    p->local = {17, gid(1)};
    p->remote = {33, gid(3)};
    p->remote_known = true;
    p->paired = true;
    p->peer.local = true;
  }

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

  vf::FailoverRequest request_from_peer(std::uint32_t epoch) const {
    vf::FailoverRequest request;
    request.local = p->remote;  // the sender's view: its QP, then ours
    request.remote = p->local;
    request.epoch = epoch;
    request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kPortDown);
    request.target_path = vf::kStandby;
    return request;
  }
  void deliver(const vf::FailoverRequest& m) {
    vf::failover::handle_failover(*e, m.remote, m.delivered_messages, m.epoch, m.target_path, true,
                                  static_cast<vf::FailoverReason>(m.reason));
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

TEST_CASE("FailoverRequest with the next epoch switches this side and answers with its count",
          "[engine]") {
  Rig rig;
  rig.deliver(rig.request_from_peer(1));
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->epoch == 1);
  CHECK(rig.p->failovers == 1);
  REQUIRE(rig.p->events.size() == 1);
  CHECK(std::string(rig.p->events[0].reason) == "peer_request");
  // The old path stopped (ERR), then reset for a later re-arm (RESET, INIT); the standby untouched.
  REQUIRE(g_modifies.size() == 3);
  CHECK(g_modifies[0].qp == &rig.app_qp);
  CHECK(g_modifies[0].state == IBV_QPS_ERR);
  CHECK(g_modifies[1].state == IBV_QPS_RESET);
  CHECK(g_modifies[2].state == IBV_QPS_INIT);
  CHECK(rig.p->rearm[vf::kPrimary].needed);
  // The application keeps reading the state it set.
  CHECK(rig.app_qp.state == IBV_QPS_RTS);
  const auto replies = rig.sent<vf::FailoverReply>();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].epoch == 1);
  CHECK(replies[0].target_path == vf::kStandby);
  CHECK(replies[0].delivered_messages == 0);
  CHECK(replies[0].local == rig.p->local);
}

TEST_CASE("The replay is exactly what the peer did not deliver", "[engine]") {
  Rig rig;
  rig.post_send(0x51);
  REQUIRE(g_posts.size() == 1);  // on the primary, as the application posted it
  CHECK(g_posts[0].qp == &rig.app_qp);
  auto request = rig.request_from_peer(1);
  SECTION("delivered: completed as proven done, not sent again") {
    request.delivered_messages = 1;
    rig.deliver(request);
    CHECK(rig.v->counters.replayed_wrs.load() == 0);
    CHECK(rig.v->counters.synthesized_completions.load() == 1);
    CHECK(g_posts.size() == 1);
    ibv_wc wc{};
    REQUIRE(rig.cq_state->stash.pop(1, &wc) == 1);
    CHECK(wc.wr_id == 0x51);
    CHECK(wc.status == IBV_WC_SUCCESS);
  }
  SECTION("not delivered: sent again on the standby, once") {
    request.delivered_messages = 0;
    rig.deliver(request);
    CHECK(rig.v->counters.replayed_wrs.load() == 1);
    CHECK(rig.v->counters.synthesized_completions.load() == 0);
    REQUIRE(g_posts.size() == 2);
    CHECK(g_posts[1].qp == &rig.standby_qp);
    CHECK(rig.cq_state->stash.size() == 0);
  }
}

TEST_CASE("FailoverRequest for a silent failure holds the path down while its port is ACTIVE",
          "[engine]") {
  Rig rig;
  auto request = rig.request_from_peer(1);
  request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kErrorCompletion);
  SECTION("port ACTIVE: held down, reported unprotected") {
    rig.deliver(request);
    CHECK(rig.v->active_path() == vf::kStandby);
    CHECK(rig.p->hold[vf::kPrimary].until_ns != 0);
    CHECK(rig.p->unprotected_reason.find("held down") != std::string::npos);
  }
  SECTION("port down: the port explains it, no hold") {
    g_port_state = IBV_PORT_DOWN;
    rig.deliver(request);
    CHECK(rig.v->active_path() == vf::kStandby);
    CHECK(rig.p->hold[vf::kPrimary].until_ns == 0);
  }
}

TEST_CASE("FailoverRequest with a stale epoch, or a reply to no switch, changes nothing",
          "[engine]") {
  Rig rig;
  rig.p->epoch = 3;
  rig.deliver(rig.request_from_peer(3));
  rig.deliver(rig.request_from_peer(2));
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 4, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK(rig.v->mode() == vf::PostMode::kDirect);
  CHECK(rig.p->epoch == 3);
  CHECK(rig.p->failovers == 0);
  CHECK(g_modifies.empty());
  CHECK(rig.e->local_inbox.empty());
}

TEST_CASE("A port down under the active path starts the switch and asks the peer", "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  CHECK(rig.v->path[vf::kPrimary].failed);
  CHECK(rig.p->sw.in_progress);  // waits for the peer's count
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.v->mode() == vf::PostMode::kRouted);
  const auto requests = rig.sent<vf::FailoverRequest>();
  REQUIRE(requests.size() == 1);
  CHECK(requests[0].epoch == 1);
  CHECK(requests[0].reason == static_cast<std::uint32_t>(vf::FailoverReason::kPortDown));
  CHECK(requests[0].target_path == vf::kStandby);
  // The peer's reply finishes it.
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 1, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->failovers == 1);
  CHECK(rig.p->unprotected_reason.find("port fake0/1 is down") != std::string::npos);
}

TEST_CASE("A port down under the idle standby reports the QP unprotected, no switch", "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 1, 1, IBV_PORT_DOWN);
  CHECK(rig.v->path[vf::kStandby].failed);
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->rearm[vf::kStandby].needed);
  CHECK(rig.p->unprotected_reason.find("standby path's port fake1/1 is down") != std::string::npos);
  CHECK(g_modifies.empty());
  const auto notices = rig.sent<vf::PathStatus>();
  REQUIRE(notices.size() == 1);  // the peer is told (its side of the path looks fine)
  CHECK(notices[0].path == vf::kStandby);
  CHECK_FALSE(notices[0].up);
}

TEST_CASE("PathStatus: the peer's end of the idle standby lost its port", "[engine]") {
  Rig rig;
  vf::PathStatus status;
  status.local = rig.p->remote;
  status.remote = rig.p->local;
  status.path = vf::kStandby;
  status.up = false;
  SECTION("from the pair's peer: the path is failed and the QP unprotected") {
    vf::failover::handle_path_status(*rig.e, status);
    CHECK(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->rearm[vf::kStandby].needed);
    CHECK(rig.p->unprotected_reason.find("lost its port") != std::string::npos);
  }
  SECTION("from an earlier pair of a reused QP number: ignored") {
    status.local.qpn = 99;
    vf::failover::handle_path_status(*rig.e, status);
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->unprotected_reason.empty());
  }
}

TEST_CASE("Rearm: a request for a path that is held down is not answered", "[engine]") {
  Rig rig;
  rig.v->path[vf::kStandby].connected = false;
  rig.p->rearm[vf::kStandby].needed = true;
  rig.p->hold[vf::kStandby].until_ns = ~0ull;
  vf::Rearm request;
  request.local = rig.p->remote;
  request.remote = rig.p->local;
  request.path = vf::kStandby;
  request.nonce = 3;
  vf::failover::handle_rearm(*rig.e, request);
  CHECK(rig.p->rearm[vf::kStandby].seen_nonce == 3);
  CHECK(rig.p->rearm[vf::kStandby].answered_nonce == 0);
  CHECK_FALSE(rig.v->path[vf::kStandby].connected);
  CHECK(g_modifies.empty());
  CHECK(rig.e->local_inbox.empty());
}

TEST_CASE("PairRefused for want of a standby ends the pairing with the reason", "[engine]") {
  Rig rig;
  rig.p->paired = false;
  rig.p->pairing = true;
  vf::PairRefused refused{rig.p->remote, rig.p->local,
                          static_cast<std::uint32_t>(vf::PairRefusal::kUnprotected)};
  vf::failover::handle_pair_refused(*rig.e, refused);
  CHECK_FALSE(rig.p->pairing);
  CHECK_FALSE(rig.p->paired);
  CHECK(rig.p->unprotected_reason.find("no standby") != std::string::npos);
}

TEST_CASE("An RTS -> RTS modify of one attribute keeps the others for re-connecting the primary",
          "[engine]") {
  Rig rig;
  rig.p->attrs = {};
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = IBV_MTU_1024;
  rtr.dest_qp_num = 33;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.is_global = 1;
  rtr.ah_attr.port_num = 1;
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 5;
  rts.rnr_retry = 7;
  rts.max_rd_atomic = 1;
  rts.sq_psn = 0x123;
  const int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  ibv_qp_attr tune{};
  tune.qp_state = IBV_QPS_RTS;
  tune.min_rnr_timer = 14;
  tune.cur_qp_state = IBV_QPS_RTS;
  const int tune_mask = IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER | IBV_QP_CUR_STATE;
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &rtr, rtr_mask, fake_modify_qp) ==
          0);
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &rts, rts_mask, fake_modify_qp) ==
          0);
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &tune, tune_mask,
                                      fake_modify_qp) == 0);
  const int kept = rig.p->attrs.rts_mask;
  CHECK((kept & (rts_mask & ~IBV_QP_STATE)) == (rts_mask & ~IBV_QP_STATE));
  CHECK((kept & IBV_QP_MIN_RNR_TIMER) != 0);
  CHECK((kept & IBV_QP_CUR_STATE) == 0);  // asserted the state of that call, not a re-arm's
  CHECK(rig.p->attrs.rts.retry_cnt == 5);
  CHECK(rig.p->attrs.rts.min_rnr_timer == 14);
  // The re-connection's RTS carries every attribute RTR -> RTS requires, and the tuned one.
  g_modifies.clear();
  REQUIRE(vf::failover::connect_path(*rig.e, *rig.p, vf::kPrimary, 33, vf::Gid{}, 0x77));
  REQUIRE(g_modifies.size() == 2);
  CHECK(g_modifies[0].state == IBV_QPS_RTR);
  CHECK(g_modifies[1].state == IBV_QPS_RTS);
  const int required = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_MAX_QP_RD_ATOMIC;
  CHECK((g_modifies[1].mask & required) == required);
  CHECK(g_modifies[1].attr.min_rnr_timer == 14);
  CHECK(g_modifies[1].attr.retry_cnt == 5);
}

// Issue 19 item 12: a message about a pair is acted on only when it comes from that pair's peer:
// the process the QP was paired with (its token), over the control channel, about the very pair
// (its own QP key and ours). Anything else is dropped, whatever the QP numbers it names.
TEST_CASE("Messages about a pair from anyone but its peer change nothing", "[engine]") {
  Rig rig;
  rig.p->peer = {};
  rig.p->peer.token = 7;  // paired with another process
  vf::failover::PeerRef stranger;
  stranger.token = 99;
  stranger.session = 5;
  vf::failover::PeerRef peer;
  peer.token = 7;
  peer.session = 6;
  const std::vector<std::uint64_t> no_posts;
  SECTION("FailoverRequest from another process: no switch") {
    vf::ControlMessage m = rig.request_from_peer(1);
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
    CHECK(rig.p->epoch == 0);
    CHECK(g_modifies.empty());
  }
  SECTION("FailoverRequest from the peer naming another QP of its own: no switch") {
    vf::FailoverRequest request = rig.request_from_peer(1);
    request.local.qpn = 34;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, peer, peer.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
  }
  SECTION("FailoverRequest from a local pair's stand-in over the network: no switch") {
    rig.p->peer = {};
    rig.p->peer.local = true;
    vf::ControlMessage m = rig.request_from_peer(1);
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
  }
  SECTION("FailoverReply from another process does not finish a switch") {
    // Begun while the rig's peer is this process (so the request is "sent"), then the peer is
    // the other process again for the answers.
    rig.p->peer = {};
    rig.p->peer.local = true;
    vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
    REQUIRE(rig.p->sw.in_progress);
    rig.p->peer = {};
    rig.p->peer.token = 7;
    vf::FailoverReply reply;
    reply.local = rig.p->remote;
    reply.remote = rig.p->local;
    reply.epoch = rig.p->sw.epoch;
    reply.target_path = vf::kStandby;
    reply.delivered_messages = 1000;  // would make undelivered work look delivered
    vf::ControlMessage m = reply;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.peer_known);
    CHECK(rig.p->sw.in_progress);
    // The peer's own reply still finishes it.
    reply.delivered_messages = 0;
    m = reply;
    vf::failover::process_message(*rig.e, peer, peer.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.p->failovers == 1);
  }
  SECTION("PathStatus from another process: the standby stays in use") {
    vf::PathStatus status;
    status.local = rig.p->remote;
    status.remote = rig.p->local;
    status.path = vf::kStandby;
    vf::ControlMessage m = status;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->unprotected_reason.empty());
  }
  SECTION("Rearm from another process: the standby is not re-connected anywhere") {
    rig.v->path[vf::kStandby].connected = false;
    rig.p->rearm[vf::kStandby].needed = true;
    vf::Rearm request;
    request.local = rig.p->remote;
    request.remote = rig.p->local;
    request.path = vf::kStandby;
    request.qpn = 4242;
    request.nonce = 3;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->rearm[vf::kStandby].seen_nonce == 0);
    CHECK_FALSE(rig.v->path[vf::kStandby].connected);
    CHECK(g_modifies.empty());
  }
  SECTION("PairRefused on another session than the request's: the pairing goes on") {
    rig.p->paired = false;
    rig.p->pairing = true;
    rig.p->awaiting_session = 6;
    vf::PairRefused refused{rig.p->remote, rig.p->local,
                            static_cast<std::uint32_t>(vf::PairRefusal::kUnprotected)};
    vf::ControlMessage m = refused;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->pairing);
    CHECK(rig.p->unprotected_reason.empty());
  }
  SECTION("PairRequest on a paired QP from another process: the pair keeps its peer") {
    vf::PairRequest request;
    request.local = {55, gid(9)};
    request.remote = rig.p->local;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->peer.token == 7);
    CHECK(rig.p->remote.qpn == 33);
    CHECK(rig.sent<vf::PairReply>().empty());
  }
}

// Issue 19 item 12: a switch that cannot complete (the peer never answers) shows the application
// what its QP in ERR would have: every request posted during the attempt, which reached no QP,
// completes with IBV_WC_WR_FLUSH_ERR, signaled or not (a device reports every flushed WR, so
// that its owner can reclaim the buffers; rxe's flush_send_queue, mlx5 alike).
TEST_CASE("A switch given up flushes every request posted during it, unsignaled ones too",
          "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->sw.in_progress);
  rig.post_send(1);
  rig.post_send(2, false);
  rig.post_send(3, false);
  rig.post_send(4);
  CHECK(g_posts.empty());  // held: the switch is not done
  vf::failover::abort_switch(*rig.p, "test: the peer never answered");
  ibv_wc wc[8]{};
  const int n = rig.cq_state->poll(8, wc);
  REQUIRE(n == 4);
  for (int i = 0; i < n; ++i) {
    CHECK(wc[i].wr_id == static_cast<std::uint64_t>(i + 1));
    CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wc[i].opcode == IBV_WC_SEND);
    CHECK(wc[i].qp_num == 17);
  }
  CHECK(rig.cq_state->poll(8, wc) == 0);
  CHECK(rig.v->mode() == vf::PostMode::kBypass);
}
