// The move of a shared receive queue with its QPs (issue 19 item 2, core/failover/srq_group.cc),
// on the rig of tests/unit/engine_rig.h with a second QP on the same SRQ: a move must not harm a
// member that would have kept working without the shim, and must never post one receive buffer
// twice (a member left behind may still have completions of its receives in its CQ that the
// application has not polled).
#include <map>
#include <memory>
#include <vector>

#include "core/datapath_registries.h"
#include "core/failover/srq_group.h"
#include "core/virtual_srq.h"
#include "tests/unit/engine_rig.h"

namespace {

// What each CQ's provider still holds, returned by its polls in order.
std::map<const ibv_cq*, std::vector<ibv_wc>> g_cq_entries;

int queued_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  std::vector<ibv_wc>& entries = g_cq_entries[cq];
  int n = 0;
  while (n < num_entries && !entries.empty()) {
    wc[n++] = entries.front();
    entries.erase(entries.begin());
  }
  return n;
}

std::vector<std::uint64_t> g_srq_posts[2];  // wr_ids posted on the primary and standby SRQ
int post_primary_srq(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr**) {
  for (; wr != nullptr; wr = wr->next) g_srq_posts[vf::kPrimary].push_back(wr->wr_id);
  return 0;
}
int post_standby_srq(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr**) {
  for (; wr != nullptr; wr = wr->next) g_srq_posts[vf::kStandby].push_back(wr->wr_id);
  return 0;
}

// The rig's QP 17 (standby 18, peer 33) and QP 19 (standby 20, peer 35, its own CQ) on one SRQ
// of fake0, with its shadow on fake1; both QPs found by their numbers as the datapath finds them.
struct GroupRig {
  Rig rig;
  ibv_context_ops saved = g_ops;
  ibv_context_ops srq_ops{};
  ibv_srq app_srq{};
  ibv_srq shadow_srq{};
  ibv_qp app_qp2{};
  ibv_qp standby_qp2{};
  ibv_cq cq2{};
  std::unique_ptr<vf::CqState> cq2_state;
  vf::failover::SrqGroup* group = nullptr;
  vf::VirtualQp* v2 = nullptr;
  Protection* p2 = nullptr;

  GroupRig() {
    g_cq_entries.clear();
    g_srq_posts[0].clear();
    g_srq_posts[1].clear();
    g_ops.poll_cq = queued_poll_cq;
    srq_ops = g_ops;
    srq_ops.post_srq_recv = post_primary_srq;
    rig.contexts[1].ops.post_srq_recv = post_standby_srq;
    app_srq.context = &rig.contexts[0];
    shadow_srq.context = &rig.contexts[1];
    group = &rig.e->srqs[&app_srq];
    group->srq = std::make_unique<vf::VirtualSrq>(&app_srq, &srq_ops, 16, 1, 0);
    group->srq->shadow = &shadow_srq;
    group->srq->shadow_device_index = 1;

    app_qp2.qp_num = 19;
    app_qp2.context = &rig.contexts[0];
    app_qp2.state = IBV_QPS_RTS;
    standby_qp2.qp_num = 20;
    standby_qp2.context = &rig.contexts[1];
    cq2.context = &rig.contexts[0];
    cq2.cqe = 64;
    cq2_state = std::make_unique<vf::CqState>(&cq2, 0, &g_ops, 2 * 64 + 64);
    p2 = &rig.add_protected_qp(&app_qp2, &standby_qp2, cq2_state.get(), {35, gid(4)}, 101, 201);
    v2 = p2->qp.get();

    rig.v->srq = v2->srq = group->srq.get();
    group->members = {rig.v, v2};
    REQUIRE(vf::datapath_registries::qps_by_qpn.insert(vf::qpn_registry_key(0, 17), rig.v));
    REQUIRE(vf::datapath_registries::qps_by_qpn.insert(vf::qpn_registry_key(0, 19), v2));
  }
  ~GroupRig() {
    vf::datapath_registries::qps_by_qpn.erase(vf::qpn_registry_key(0, 17));
    vf::datapath_registries::qps_by_qpn.erase(vf::qpn_registry_key(0, 19));
    rig.v->srq = v2->srq = nullptr;
    g_ops = saved;
  }
  GroupRig(const GroupRig&) = delete;
  GroupRig& operator=(const GroupRig&) = delete;

  int post(std::uint64_t wr_id) {
    return Rig::post_one_receive(wr_id, [&](ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return group->srq->post_recv(wr, bad);
    });
  }
  // A message QP 19 took from the SRQ: its completion waits in QP 19's CQ, not yet polled.
  void arrives_on_qp2(std::uint64_t wr_id) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = 19;
    wc.byte_len = 8;
    g_cq_entries[&cq2].push_back(wc);
  }
  // QP 19's peer answers the switch request QP 19 sent when it moved along.
  void answer_qp2_request() {
    for (const vf::FailoverRequest& request : rig.sent<vf::FailoverRequest>()) {
      if (request.local.qpn != 19) continue;
      vf::FailoverReply reply;
      reply.local = request.remote;
      reply.remote = request.local;
      reply.epoch = request.epoch;
      reply.target_path = request.target_path;
      rig.receive(reply);
    }
  }
  bool moved_to_error(const ibv_qp* qp) const {
    for (const ModifyCall& call : g_modifies) {
      if (call.qp == qp && call.state == IBV_QPS_ERR) return true;
    }
    return false;
  }
  std::vector<std::uint64_t> polled(vf::CqState& cq) {
    ibv_wc wc[8];
    cq.lock.lock();
    const int n = cq.poll_merged_locked(8, wc);  // releases the lock
    std::vector<std::uint64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(wc[i].wr_id);
    return out;
  }
};

}  // namespace

TEST_CASE("A shared receive queue does not move away from a member whose own path works",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x10) == 0);
  REQUIRE(g.post(0x11) == 0);
  // QP 19's standby is not connected (its peer's shim has not re-armed it): it cannot move.
  g.v2->path[vf::kStandby].connected = false;
  // QP 17's peer lost its port and asks for the switch.
  g.rig.deliver(g.rig.request_from_peer(1));
  // QP 19 would have kept working without the shim: it is untouched, and the receives stay
  // where it takes them.
  CHECK_FALSE(g.moved_to_error(&g.app_qp2));
  CHECK(g.v2->mode() == vf::PostMode::kDirect);
  CHECK(g.p2->unprotected_reason.empty());
  CHECK(g.group->srq->active_path() == vf::kPrimary);
  CHECK(g_srq_posts[vf::kStandby].empty());
  // QP 17 fails as it would have without the shim, and its peer learns the pair is over (it
  // waits for no answer).
  CHECK(g.rig.v->application_failed.load());
  CHECK(g.rig.v->active_path() == vf::kPrimary);
  CHECK_FALSE(g.rig.sent<vf::PairEnded>().empty());
  CHECK_FALSE(g.rig.p->unprotected_reason.empty());
}

TEST_CASE("A member left behind by its SRQ's move keeps its unpolled receives off the move",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x20) == 0);
  REQUIRE(g.post(0x21) == 0);
  // QP 19 took 0x20; the application has not polled its completion yet.
  g.arrives_on_qp2(0x20);
  // The port goes down under both; QP 19 has no standby to go to.
  g.v2->path[vf::kStandby].connected = false;
  g.rig.v->path[vf::kPrimary].failed = true;
  g.v2->path[vf::kPrimary].failed = true;
  vf::failover::start_switch(*g.rig.e, *g.rig.p, vf::kStandby, vf::FailoverReason::kPortDown);
  REQUIRE(g.group->srq->active_path() == vf::kStandby);
  REQUIRE(g.rig.v->active_path() == vf::kStandby);
  CHECK(g.moved_to_error(&g.app_qp2));
  // Only 0x21 is posted on the standby SRQ: 0x20's buffer holds a message the application has
  // yet to read, and a second message must not land in it.
  CHECK(g_srq_posts[vf::kStandby].size() == 1);
  // The application still gets 0x20's message.
  CHECK(g.polled(*g.cq2_state) == std::vector<std::uint64_t>{0x20});
}

TEST_CASE("A member still pairing when the SRQ's wait runs out keeps the SRQ where it is",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x30) == 0);
  // QP 19 was connected a moment ago: its pairing is in flight, its own path works.
  g.p2->paired = false;
  g.p2->pairing = true;
  g.rig.deliver(g.rig.request_from_peer(1));
  REQUIRE(g.group->pending.active);  // the move waits for the pairing, at most 1 s
  CHECK(g.rig.sent<vf::FailoverReply>().empty());
  // The wait runs out (the test does not sleep through it) and periodic_work retries the move.
  g.group->pending.since_ns = 0;
  vf::failover::switch_srq_group(*g.rig.e, *g.group, g.group->pending.target,
                                 g.group->pending.reason, nullptr, 0, 0);
  CHECK_FALSE(g.group->pending.active);
  CHECK_FALSE(g.moved_to_error(&g.app_qp2));
  CHECK(g.v2->mode() == vf::PostMode::kDirect);
  CHECK(g.group->srq->active_path() == vf::kPrimary);
  CHECK(g_srq_posts[vf::kStandby].empty());
  // QP 17's peer is answered: the pair is over, and QP 17 fails as without the shim.
  CHECK(g.rig.v->application_failed.load());
  CHECK_FALSE(g.rig.sent<vf::PairEnded>().empty());
}

TEST_CASE("A member given up on its standby takes its application's QP down with it",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x40) == 0);
  // Both QPs and the SRQ run on the standby; QP 17's primary is re-armed, QP 19's is not.
  g.rig.deliver(g.rig.request_from_peer(1));
  REQUIRE(g.group->srq->active_path() == vf::kStandby);
  g.answer_qp2_request();
  REQUIRE(g.v2->active_path() == vf::kStandby);
  REQUIRE_FALSE(g.p2->sw.in_progress);
  g.v2->path[vf::kPrimary].connected = false;
  g_modifies.clear();
  // The standby's port goes down under both: QP 19 cannot go back, QP 17 can.
  g.rig.v->path[vf::kStandby].failed = true;
  g.v2->path[vf::kStandby].failed = true;
  g.rig.v->path[vf::kPrimary].connected = true;
  g.rig.v->path[vf::kPrimary].failed = false;
  g.group->srq->may_hold_stale[vf::kPrimary] = false;  // nothing to sweep there
  vf::failover::start_switch(*g.rig.e, *g.rig.p, vf::kPrimary, vf::FailoverReason::kPortDown);
  REQUIRE(g.group->srq->active_path() == vf::kPrimary);
  // QP 19 fails as it would have: its standby and its application's QP in ERR, its posts
  // going to the application's QP (whose completions are the application's).
  CHECK(g.moved_to_error(&g.standby_qp2));
  CHECK(g.moved_to_error(&g.app_qp2));
  CHECK(g.v2->active_path() == vf::kPrimary);
  CHECK(g.v2->mode() == vf::PostMode::kBypass);
  CHECK(g.v2->application_failed.load());
}

TEST_CASE("A standby flush that comes after its QP was given up reaches the application as its own",
          "[engine]") {
  GroupRig g;
  g.rig.deliver(g.rig.request_from_peer(1));
  g.answer_qp2_request();
  REQUIRE(g.v2->active_path() == vf::kStandby);
  // QP 19 sends on the standby: the standby QP gets the ring's sequence as its wr_id.
  char payload[8] = "message";
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(payload), sizeof payload, 0};
  ibv_send_wr wr{};
  wr.wr_id = 0x4242;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  REQUIRE(g.v2->post_send(&wr, &bad) == 0);
  std::uint64_t sequence = 0;
  for (const PostCall& call : g_posts) {
    if (call.qp == &g.standby_qp2) sequence = call.wr_id;
  }
  REQUIRE(sequence != 0);
  // The standby's port goes down; QP 19 cannot go back (its primary is not re-connected).
  g.v2->path[vf::kPrimary].connected = false;
  g.rig.v->path[vf::kStandby].failed = true;
  g.v2->path[vf::kStandby].failed = true;
  g.rig.v->path[vf::kPrimary].connected = true;
  g.rig.v->path[vf::kPrimary].failed = false;
  g.group->srq->may_hold_stale[vf::kPrimary] = false;
  vf::failover::start_switch(*g.rig.e, *g.rig.p, vf::kPrimary, vf::FailoverReason::kPortDown);
  REQUIRE(g.v2->mode() == vf::PostMode::kBypass);
  // The standby writes the send's flush only now (rxe's completer runs later).
  ibv_wc wc{};
  wc.wr_id = sequence;
  wc.status = IBV_WC_WR_FLUSH_ERR;
  wc.opcode = IBV_WC_SEND;
  wc.qp_num = 20;
  g.v2->lock().lock();
  const bool shown = g.v2->on_completion_locked(*g.cq2_state, vf::kStandby, wc);
  g.v2->lock().unlock();
  CHECK(shown);
  CHECK(wc.wr_id == 0x4242);
  CHECK(wc.qp_num == 19);
}

ibv_cq* no_cq(ibv_context*, int, void*, ibv_comp_channel*, int) {
  return nullptr;
}

TEST_CASE("An SRQ that cannot sweep the other path's SRQ stays and keeps its working members",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x50) == 0);
  g.rig.deliver(g.rig.request_from_peer(1));
  REQUIRE(g.group->srq->active_path() == vf::kStandby);
  g.answer_qp2_request();
  REQUIRE_FALSE(g.p2->sw.in_progress);
  REQUIRE(g.group->srq->may_hold_stale[vf::kPrimary]);
  // Both primaries re-armed; QP 17's peer loses its standby port and asks to go back, but the
  // primary SRQ, which may hold stale receives, cannot be swept.
  for (vf::VirtualQp* v : {g.rig.v, g.v2}) {
    v->path[vf::kPrimary].connected = true;
    v->path[vf::kPrimary].failed = false;
  }
  g.rig.e->verbs.create_cq = no_cq;
  vf::FailoverRequest back = g.rig.request_from_peer(2);
  back.target_path = vf::kPrimary;
  g.rig.deliver(back);
  CHECK(g.group->srq->active_path() == vf::kStandby);
  // QP 19 works on the standby and stays there, untouched; QP 17 fails as without the shim.
  CHECK(g.v2->active_path() == vf::kStandby);
  CHECK(g.v2->mode() == vf::PostMode::kRouted);
  CHECK(g.p2->unprotected_reason.empty());
  CHECK(g.rig.v->application_failed.load());
  CHECK_FALSE(g.rig.sent<vf::PairEnded>().empty());
}

TEST_CASE("A failback the peer asks for waits for the SRQ's other QPs and is answered then",
          "[engine]") {
  GroupRig g;
  REQUIRE(g.post(0x60) == 0);
  g.rig.deliver(g.rig.request_from_peer(1));
  g.answer_qp2_request();
  REQUIRE(g.group->srq->active_path() == vf::kStandby);
  // QP 17's primary is re-armed, QP 19's not yet; QP 17's peer asks to fail back.
  g.rig.v->path[vf::kPrimary].connected = true;
  g.rig.v->path[vf::kPrimary].failed = false;
  g.v2->path[vf::kPrimary].connected = false;
  g.group->srq->may_hold_stale[vf::kPrimary] = false;  // nothing to sweep there
  auto answers_to_failback = [&] {
    std::vector<vf::FailoverReply> out;
    for (const vf::FailoverReply& reply : g.rig.sent<vf::FailoverReply>()) {
      if (reply.epoch == 2) out.push_back(reply);
    }
    return out;
  };
  g.rig.deliver(g.rig.failback_request_from_peer(2));
  CHECK(g.group->srq->active_path() == vf::kStandby);
  CHECK(answers_to_failback().empty());
  REQUIRE(g.group->pending.active);
  // QP 19's primary is re-armed: periodic_work's retry moves the SRQ and answers the peer.
  g.v2->path[vf::kPrimary].connected = true;
  vf::failover::switch_srq_group(*g.rig.e, *g.group, g.group->pending.target,
                                 g.group->pending.reason, nullptr, 0, 0);
  CHECK(g.group->srq->active_path() == vf::kPrimary);
  CHECK(g.rig.v->active_path() == vf::kPrimary);
  const auto replies = answers_to_failback();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].local.qpn == 17);
  CHECK(replies[0].target_path == vf::kPrimary);
}

TEST_CASE("A failback that waited too long for the SRQ's other QPs tells the peer the pair ended",
          "[engine]") {
  GroupRig g;
  g.rig.deliver(g.rig.request_from_peer(1));
  g.answer_qp2_request();
  g.rig.v->path[vf::kPrimary].connected = true;
  g.rig.v->path[vf::kPrimary].failed = false;
  g.v2->path[vf::kPrimary].connected = false;
  g.rig.deliver(g.rig.failback_request_from_peer(2));
  REQUIRE(g.group->pending.active);
  REQUIRE(g.group->pending.passives.size() == 1);
  CHECK(g.rig.sent<vf::PairEnded>().empty());
  // Its wait runs out (the test does not sleep through it); QP 19 is still not re-connected.
  g.group->pending.passives[0].asked_ns = 0;
  vf::failover::switch_srq_group(*g.rig.e, *g.group, g.group->pending.target,
                                 g.group->pending.reason, nullptr, 0, 0);
  CHECK_FALSE(g.group->pending.active);
  CHECK(g.group->srq->active_path() == vf::kStandby);
  // The peer is told now, well before its own wait for the answer ends.
  CHECK_FALSE(g.rig.sent<vf::PairEnded>().empty());
  CHECK(g.rig.p->ended);
}

TEST_CASE("A failback the peer asks for that cannot sweep the primary SRQ tells the peer at once",
          "[engine]") {
  GroupRig g;
  g.rig.deliver(g.rig.request_from_peer(1));
  g.answer_qp2_request();
  REQUIRE(g.group->srq->may_hold_stale[vf::kPrimary]);
  for (vf::VirtualQp* v : {g.rig.v, g.v2}) {
    v->path[vf::kPrimary].connected = true;
    v->path[vf::kPrimary].failed = false;
  }
  g.rig.e->verbs.create_cq = no_cq;  // the sweep of the primary SRQ cannot run
  g.rig.deliver(g.rig.failback_request_from_peer(2));
  CHECK(g.group->srq->active_path() == vf::kStandby);
  CHECK_FALSE(g.group->pending.active);
  // The peer is not left waiting 10 s for an answer that will not come.
  CHECK_FALSE(g.rig.sent<vf::PairEnded>().empty());
  // QP 19, whose peer asked nothing, goes on on the standby.
  CHECK(g.v2->active_path() == vf::kStandby);
  CHECK(g.v2->mode() == vf::PostMode::kRouted);
}
