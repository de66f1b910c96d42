// A QP whose failure the application has seen (issue 19 item 1), on the rig of
// tests/unit/engine_rig.h: once an error completion of a request or receive has reached the
// application because no path was left, the QP is failed for good, as it would be without the
// shim: a path that heals later is neither re-armed nor switched to, nothing is replayed, and no
// wr_id completes a second time.
#include "core/datapath_registries.h"
#include "core/failover/path_wait.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

// Moves the rig's traffic to the standby (the peer asked: its port went down) and leaves the
// primary as a cut leaves it: failed, reset for re-use, waiting for its re-arm.
void fail_over_with_primary_down(Rig& rig) {
  rig.deliver(rig.request_from_peer(1));
  REQUIRE(rig.v->active_path() == vf::kStandby);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  rig.v->path[vf::kPrimary].failed = true;
  REQUIRE_FALSE(rig.v->path[vf::kPrimary].connected);
  REQUIRE(rig.p->rearm[vf::kPrimary].needed);
}

// What the application's poll returns for one completion of the standby's CQ: false when the
// shim hides it.
bool shown_to_application(Rig& rig, ibv_wc& wc) {
  rig.v->lock().lock();
  const bool shown = rig.v->on_completion_locked(*rig.cq_state, vf::kStandby, wc);
  rig.v->lock().unlock();
  return shown;
}

// The rig's first SEND runs out of retries on the primary; whether the application sees it.
bool primary_send_fails(Rig& rig) {
  ibv_wc error{};
  error.wr_id = g_posts[0].wr_id;
  error.status = IBV_WC_RETRY_EXC_ERR;
  error.opcode = IBV_WC_SEND;
  error.qp_num = 17;
  rig.v->lock().lock();
  const bool shown = rig.v->on_completion_locked(*rig.cq_state, vf::kPrimary, error);
  rig.v->lock().unlock();
  return shown;
}

ibv_wc standby_completion(std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = 18;
  return wc;
}

// Both paths fail: after the failover, the standby's first SEND (wr_id) runs out of retries and,
// with no path left, the application sees it.
void fail_both_paths(Rig& rig, std::uint64_t wr_id) {
  fail_over_with_primary_down(rig);
  rig.post_send(wr_id);
  ibv_wc error = standby_completion(g_posts[0].wr_id, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
  REQUIRE(shown_to_application(rig, error));
}

// A QP failed for good on the standby: 40 requests and 40 receives (the rig's queues hold 16
// each) are each taken and flushed once, with the application's wr_id, as on its QP in ERR.
void posts_flush_without_end(Rig& rig) {
  for (std::uint64_t i = 0; i < 40; ++i) {  // the rig's queues hold 16 each
    INFO("post " << i);
    rig.post_send(0x100 + i);
    ibv_wc flush = standby_completion(g_posts.back().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
    REQUIRE(shown_to_application(rig, flush));
    CHECK(flush.wr_id == 0x100 + i);
    const std::size_t receives = g_recv_posts.size();
    rig.post_recv(0x200 + i);
    REQUIRE(g_recv_posts.size() == receives + 1);
    ibv_wc recv_flush =
        standby_completion(g_recv_posts.back().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
    REQUIRE(shown_to_application(rig, recv_flush));
    CHECK(recv_flush.wr_id == 0x200 + i);
  }
}

}  // namespace

TEST_CASE("After both paths failed, a healed primary replays nothing the application saw fail",
          "[engine]") {
  Rig rig;
  fail_over_with_primary_down(rig);
  rig.post_recv(0x71);
  rig.post_send(0x51);
  REQUIRE(g_posts.size() == 1);
  CHECK(g_posts[0].qp == &rig.standby_qp);
  REQUIRE_FALSE(g_recv_posts.empty());
  CHECK(g_recv_posts.back().qp == &rig.standby_qp);

  rig.e->local_inbox.clear();
  // The standby dies too: its request runs out of retries and the QP flushes the receive. With
  // no path left, the application gets both errors, translated to its own wr_ids.
  ibv_wc send_error = standby_completion(g_posts[0].wr_id, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
  REQUIRE(shown_to_application(rig, send_error));
  CHECK(send_error.wr_id == 0x51);
  CHECK(send_error.qp_num == 17);
  ibv_wc recv_flush =
      standby_completion(g_recv_posts.back().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  REQUIRE(shown_to_application(rig, recv_flush));
  CHECK(recv_flush.wr_id == 0x71);
  // A request posted after the failure goes where the application's QP in ERR would send it: a
  // flush, shown once.
  rig.post_send(0x52);
  REQUIRE(g_posts.size() == 2);
  ibv_wc late = standby_completion(g_posts[1].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  REQUIRE(shown_to_application(rig, late));
  CHECK(late.wr_id == 0x52);

  // The engine learns of it: the QP is reported unprotected, for good.
  vf::failover::periodic_work(*rig.e);
  CHECK_THAT(rig.p->unprotected_reason, Catch::Contains("the application has seen"));

  // The primary heals. Its re-arm is not asked for, and even a failback started as the re-arm's
  // reply would start one replays nothing, synthesizes nothing, posts nothing on the primary.
  rig.v->path[vf::kPrimary].failed = false;
  vf::failover::maybe_rearm(*rig.e, *rig.p, vf::kPrimary);
  vf::failover::periodic_work(*rig.e);
  CHECK(rig.sent<vf::Rearm>().empty());
  // Nor is the peer's request to re-arm it answered (its QP would be connected to one in ERR).
  const vf::Rearm asked = rig.rearm_from_peer(vf::kPrimary, 1);
  const std::size_t modifies_before_rearm = g_modifies.size();
  vf::failover::handle_rearm(*rig.e, asked);
  CHECK(rig.sent<vf::Rearm>().empty());
  CHECK(g_modifies.size() == modifies_before_rearm);
  rig.v->path[vf::kPrimary].connected = true;
  const std::size_t modifies = g_modifies.size();
  const std::size_t receives = g_recv_posts.size();
  vf::failover::start_switch(*rig.e, *rig.p, vf::kPrimary, vf::FailoverReason::kFailback);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.p->failbacks == 0);
  CHECK(g_modifies.size() == modifies);
  CHECK(g_posts.size() == 2);
  CHECK(g_recv_posts.size() == receives);
  CHECK(rig.v->counters.replayed_wrs.load() == 0);
  CHECK(rig.v->counters.synthesized_completions.load() == 0);
  CHECK(rig.cq_state->stash.size() == 0);
  CHECK(rig.sent<vf::FailoverRequest>().empty());
}

TEST_CASE("After both paths failed, the peer's request to switch back changes nothing",
          "[engine]") {
  Rig rig;
  fail_both_paths(rig, 0x61);
  rig.v->path[vf::kPrimary].failed = false;
  rig.v->path[vf::kPrimary].connected = true;
  rig.e->local_inbox.clear();
  rig.deliver(rig.failback_request_from_peer(2));
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(g_posts.size() == 1);
  CHECK(rig.v->counters.synthesized_completions.load() == 0);
  CHECK(rig.cq_state->stash.size() == 0);
}

// The peer's side of it (review of item 1): the end whose QP failed for good says so (PairEnded)
// when it happens and in answer to anything the peer asks about that QP, so the peer neither
// waits 10 s for a switch that will never be answered nor asks to re-arm its paths for ever.
TEST_CASE("A QP failed for good tells its peer, and answers every later request so", "[engine]") {
  Rig rig;
  fail_both_paths(rig, 0x61);
  rig.e->local_inbox.clear();
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.sent<vf::PairEnded>().size() == 1);
  CHECK(rig.sent<vf::PairEnded>()[0] == vf::PairEnded{rig.p->local, rig.p->remote});
  // The peer missed it (or asked before it arrived): each of its requests is answered with it.
  rig.v->path[vf::kPrimary].failed = false;
  rig.v->path[vf::kPrimary].connected = true;
  rig.e->local_inbox.clear();
  rig.receive(rig.failback_request_from_peer(2));
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
  rig.receive(rig.rearm_from_peer(vf::kPrimary, 1));
  CHECK(rig.sent<vf::PairEnded>().size() == 2);
  rig.receive(vf::PathStatus{rig.p->remote, rig.p->local, vf::kPrimary, true, 0});
  CHECK(rig.sent<vf::PairEnded>().size() == 3);
  CHECK(rig.sent<vf::Rearm>().empty());
  CHECK(rig.sent<vf::FailoverReply>().empty());
}

TEST_CASE("A QP the application took down answers its peer's switch with PairEnded",
          "[engine]") {
  Rig rig;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &attr, IBV_QP_STATE,
                                      fake_modify_qp) == 0);
  rig.e->local_inbox.clear();
  rig.receive(rig.request_from_peer(1));
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK(rig.sent<vf::FailoverReply>().empty());
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
}

TEST_CASE("The peer's QP failed for good: a switch waiting for it ends at once", "[engine]") {
  Rig rig;
  rig.post_send(0x81);
  REQUIRE(g_posts.size() == 1);
  // The primary fails silently: the request's error is hidden and the switch begins.
  CHECK_FALSE(primary_send_fails(rig));
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.p->sw.in_progress);
  REQUIRE_FALSE(rig.p->sw.peer_known);
  // The peer answers that its QP is failed for good: the switch ends now, not after 10 s, and
  // the application gets the error it would have got without the shim.
  rig.receive(vf::PairEnded{rig.p->remote, rig.p->local});
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->ended);
  CHECK_FALSE(rig.p->unprotected_reason.empty());
  CHECK(rig.cq_state->stash.size() >= 1);
  CHECK(rig.p->failovers == 0);
}

TEST_CASE("The peer's QP failed for good: no more re-arms, path news or switches", "[engine]") {
  Rig rig;
  fail_over_with_primary_down(rig);
  rig.e->local_inbox.clear();
  rig.receive(vf::PairEnded{rig.p->remote, rig.p->local});
  CHECK_THAT(rig.p->unprotected_reason, Catch::Contains("the peer's QP"));
  // The primary's port goes and comes back: nothing is asked of a peer whose QP is gone.
  rig.p->rearm[vf::kPrimary].needed = true;
  rig.p->rearm[vf::kPrimary].awaiting = false;
  for (int i = 0; i < 3; ++i) {
    vf::failover::maybe_rearm(*rig.e, *rig.p, vf::kPrimary);
    vf::failover::periodic_work(*rig.e);
  }
  vf::failover::send_path_status(*rig.e, *rig.p, vf::kPrimary, true);
  CHECK(rig.sent<vf::Rearm>().empty());
  CHECK(rig.sent<vf::PathStatus>().empty());
  rig.v->path[vf::kPrimary].failed = false;
  rig.v->path[vf::kPrimary].connected = true;
  vf::failover::start_switch(*rig.e, *rig.p, vf::kPrimary, vf::FailoverReason::kFailback);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.sent<vf::FailoverRequest>().empty());
  // Its traffic stays where it is, as the application's QP would without the shim.
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.v->mode() != vf::PostMode::kBypass);
}

TEST_CASE("An error shown while the QP is still pairing ends the pairing", "[engine]") {
  Rig rig;
  rig.p->paired = false;
  rig.p->pairing = true;
  rig.v->path[vf::kStandby].connected = false;
  rig.post_send(0x91);
  CHECK(primary_send_fails(rig));
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->pairing);
  CHECK_FALSE(rig.p->unprotected_reason.empty());
  // The peer had accepted the pairing already: its late reply does not pair the QP, and the
  // peer is told the pair is over (its requests would otherwise wait for answers).
  rig.e->local_inbox.clear();
  vf::PairReply reply;
  reply.pair.local = rig.p->remote;
  reply.pair.remote = rig.p->local;
  rig.receive(reply);
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
  CHECK_FALSE(rig.p->unprotected_reason.empty());
  CHECK(rig.v->path[vf::kStandby].connected == false);
}

TEST_CASE("Flushes after the application's own ERR are not a failure of both paths",
          "[engine]") {
  Rig rig;
  fail_over_with_primary_down(rig);
  rig.post_send(0x95);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &attr, IBV_QP_STATE,
                                      fake_modify_qp) == 0);
  ibv_wc flush = standby_completion(g_posts[0].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  REQUIRE(shown_to_application(rig, flush));
  CHECK(flush.wr_id == 0x95);
  CHECK_FALSE(rig.v->failure_shown.load());
  vf::failover::periodic_work(*rig.e);
  CHECK_THAT(rig.p->unprotected_reason, !Catch::Contains("no path is left"));
}

TEST_CASE("A QP failed for good reads ERR when queried, whatever its primary's state",
          "[engine]") {
  Rig rig;
  fail_both_paths(rig, 0x97);  // the primary waits in RESET/INIT for its re-arm
  REQUIRE(vf::datapath_registries::qps_by_address.insert(&rig.app_qp, rig.v));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;  // what the provider says of the primary
  rig.app_qp.state = IBV_QPS_INIT;
  vf::failover::qp_queried(&rig.app_qp, &attr, IBV_QP_STATE, IBV_QPS_RTS);
  vf::datapath_registries::qps_by_address.erase(&rig.app_qp);
  CHECK(attr.qp_state == IBV_QPS_ERR);
  CHECK(rig.app_qp.state == IBV_QPS_ERR);
}

TEST_CASE("A failed QP the application resets runs on its own QP again", "[engine]") {
  Rig rig;
  fail_both_paths(rig, 0x98);
  vf::failover::periodic_work(*rig.e);
  // The application recovers its QP as it would without the shim: RESET, INIT, RTR, RTS.
  for (ibv_qp_state state : {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    ibv_qp_attr attr{};
    attr.qp_state = state;
    REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &attr, IBV_QP_STATE,
                                        fake_modify_qp) == 0);
  }
  const std::size_t posts = g_posts.size();
  rig.post_send(0x99);
  REQUIRE(g_posts.size() == posts + 1);
  CHECK(g_posts.back().qp == &rig.app_qp);
  CHECK(g_posts.back().wr_id == 0x99);
}

TEST_CASE("A QP failed for good on the standby takes posts without end, each flushed once, as the "
          "application's QP in ERR would",
          "[engine]") {
  // Without the shim a QP in ERR flushes every request and receive posted to it, for ever; the
  // shim's rings must not fill up with records of requests that will never be replayed.
  Rig rig;
  fail_both_paths(rig, 0x51);
  posts_flush_without_end(rig);
}

TEST_CASE("A QP failed for good after a wait whose flushes were held still takes posts without end",
          "[engine]") {
  // The flushes held during the wait are shown when the grace runs out (release_held_errors
  // retires nothing): the flushes shown after them must retire those records too.
  Rig rig;
  rig.e->grace_ns = 5'000'000'000;
  rig.e->port_stable_ns = 0;
  fail_over_with_primary_down(rig);
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.v->errors_wait_for_path.load());  // the primary may come back within the grace
  rig.post_recv(0x71);
  rig.post_send(0x51);
  ibv_wc send_error = standby_completion(g_posts.back().wr_id, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
  CHECK_FALSE(shown_to_application(rig, send_error));
  ibv_wc held_flush =
      standby_completion(g_recv_posts.back().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  CHECK_FALSE(shown_to_application(rig, held_flush));
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.p->path_wait.active);
  rig.p->path_wait.until_ns = 1;
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.v->application_failed.load());
  // A real provider takes receives on a QP in ERR, and flushes them; the rig refuses them (it
  // keeps drain markers out of its tests) unless the QP's last move was to another state.
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  g_modifies.push_back({&rig.standby_qp, IBV_QPS_RTS, IBV_QP_STATE, rts});
  posts_flush_without_end(rig);
}
