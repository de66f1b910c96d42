// A QP whose failure the application has seen (issue 19 item 1), on the rig of
// tests/unit/engine_rig.h: once an error completion of a request or receive has reached the
// application because no path was left, the QP is failed for good, as it would be without the
// shim: a path that heals later is neither re-armed nor switched to, nothing is replayed, and no
// wr_id completes a second time.
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

ibv_wc standby_completion(std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = 18;
  return wc;
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
  vf::Rearm asked;
  asked.local = rig.p->remote;
  asked.remote = rig.p->local;
  asked.path = vf::kPrimary;
  asked.nonce = 1;
  asked.qpn = 33;
  asked.gid = gid(3);
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
  fail_over_with_primary_down(rig);
  rig.post_send(0x61);
  ibv_wc error = standby_completion(g_posts[0].wr_id, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
  REQUIRE(shown_to_application(rig, error));
  rig.v->path[vf::kPrimary].failed = false;
  rig.v->path[vf::kPrimary].connected = true;
  auto request = rig.request_from_peer(2);
  request.target_path = vf::kPrimary;
  request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kFailback);
  rig.e->local_inbox.clear();
  rig.deliver(request);
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(g_posts.size() == 1);
  CHECK(rig.v->counters.synthesized_completions.load() == 0);
  CHECK(rig.cq_state->stash.size() == 0);
}
