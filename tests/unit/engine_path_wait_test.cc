// The grace (issue 19 item 6, docs/design.md §5j), on the rig of tests/unit/engine_rig.h: a QP
// whose active path fails while its other path is not usable yet waits for a path, its posts
// held and its errors hidden, instead of failing; the first path usable again takes its traffic,
// and only a grace that runs out shows the application its failure.
#include <vector>

#include "core/failover/path_wait.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

constexpr std::uint64_t kGraceNs = 5'000'000'000;

std::vector<ibv_wc> stashed(Rig& rig) {
  std::vector<ibv_wc> out(64);
  out.resize(static_cast<std::size_t>(rig.cq_state->stash.pop(64, out.data())));
  return out;
}

bool primary_error_shown(Rig& rig, std::uint64_t wr_id, ibv_wc_status status) {
  ibv_wc error{};
  error.wr_id = wr_id;
  error.status = status;
  error.opcode = IBV_WC_SEND;
  error.qp_num = 17;
  rig.v->lock().lock();
  const bool shown = rig.v->on_completion_locked(*rig.cq_state, vf::kPrimary, error);
  rig.v->lock().unlock();
  return shown;
}

// The rig's traffic on the standby (0x41 posted there), then its failback to the primary: the
// primary's port goes down before the peer's answer, which finishes the failback onto it.
void fail_back_onto_a_port_that_went_down(Rig& rig, std::uint64_t grace_ns = kGraceNs) {
  rig.e->grace_ns = grace_ns;
  rig.e->port_stable_ns = 0;
  rig.fail_over_and_rearm();
  rig.post_send(0x41);
  REQUIRE(g_posts.back().qp == &rig.standby_qp);
  rig.e->local_inbox.clear();
  vf::failover::start_switch(*rig.e, *rig.p, vf::kPrimary, vf::FailoverReason::kFailback);
  REQUIRE(rig.p->sw.in_progress);
  g_port_state = IBV_PORT_DOWN;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  vf::failover::handle_failover(*rig.e, rig.p->local, 1, rig.p->sw.epoch, vf::kPrimary, false,
                                vf::FailoverReason::kFailback);
  REQUIRE(rig.p->failbacks == 1);
  vf::failover::periodic_work(*rig.e);
}

}  // namespace

TEST_CASE("A port that goes down during a failback sends the traffic back to the standby",
          "[engine]") {
  Rig rig;
  fail_back_onto_a_port_that_went_down(rig);
  // What the application posts now does not meet the dead primary: it waits for the standby.
  const std::size_t posts = g_posts.size();
  rig.post_send(0x42);
  CHECK(g_posts.size() == posts);
  // A request the failback posted there before the port went runs out of retries: hidden.
  CHECK_FALSE(primary_error_shown(rig, 0x40, IBV_WC_RETRY_EXC_ERR));

  // The standby, reset after the failback, is re-armed (this end asks) and takes the traffic.
  const std::vector<vf::Rearm> rearms = rig.sent<vf::Rearm>();
  REQUIRE_FALSE(rearms.empty());
  CHECK(rearms.back().path == vf::kStandby);
  vf::Rearm reply = rig.rearm_from_peer(vf::kStandby, rearms.back().nonce);
  reply.is_reply = true;
  vf::failover::handle_rearm(*rig.e, reply);
  REQUIRE(rig.p->sw.in_progress);
  CHECK(rig.p->sw.to == vf::kStandby);
  REQUIRE_FALSE(rig.sent<vf::FailoverRequest>().empty());
  CHECK(rig.sent<vf::FailoverRequest>().back().target_path == vf::kStandby);
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, rig.p->sw.epoch, vf::kStandby, false,
                                vf::FailoverReason::kPortDown);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.p->failovers == 2);
  REQUIRE(g_posts.size() == posts + 1);
  CHECK(g_posts.back().qp == &rig.standby_qp);
  CHECK_FALSE(rig.v->application_failed.load());
  CHECK_FALSE(rig.p->ended);
  for (const ibv_wc& wc : stashed(rig)) CHECK(wc.status == IBV_WC_SUCCESS);
}

TEST_CASE("A wait for a path that never comes back shows the application its failure",
          "[engine]") {
  Rig rig;
  fail_back_onto_a_port_that_went_down(rig);
  REQUIRE(rig.p->path_wait.active);
  rig.post_send(0x42);
  CHECK_FALSE(primary_error_shown(rig, 0x40, IBV_WC_RETRY_EXC_ERR));
  (void)stashed(rig);  // the failback's own completions

  rig.p->path_wait.until_ns = 1;  // the grace is over
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->path_wait.active);
  CHECK(rig.p->ended);
  CHECK(rig.v->application_failed.load());
  // The error held, then a flush for what the wait held, in order; nothing else.
  const std::vector<ibv_wc> shown = stashed(rig);
  REQUIRE(shown.size() == 2);
  CHECK(shown[0].wr_id == 0x40);
  CHECK(shown[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(shown[1].wr_id == 0x42);
  CHECK(shown[1].status == IBV_WC_WR_FLUSH_ERR);
  // From here every error is the application's, at once.
  CHECK(primary_error_shown(rig, 0x43, IBV_WC_WR_FLUSH_ERR));
}

TEST_CASE("Without a grace, a failback onto a port that went down does not wait", "[engine]") {
  Rig rig;
  fail_back_onto_a_port_that_went_down(rig, 0);
  CHECK_FALSE(rig.p->path_wait.active);
  CHECK_FALSE(rig.v->errors_wait_for_path.load());
  // What the application posts goes to the dead primary, whose error it then sees.
  const std::size_t posts = g_posts.size();
  rig.post_send(0x42);
  REQUIRE(g_posts.size() == posts + 1);
  CHECK(g_posts.back().qp == &rig.app_qp);
  CHECK(primary_error_shown(rig, 0x42, IBV_WC_RETRY_EXC_ERR));
}

TEST_CASE("During a wait for a path, receives go on to the active path", "[engine]") {
  Rig rig;
  fail_back_onto_a_port_that_went_down(rig);
  REQUIRE(rig.p->path_wait.active);
  const std::size_t receives = g_recv_posts.size();
  rig.post_recv(0x91);
  REQUIRE(g_recv_posts.size() == receives + 1);
  CHECK(g_recv_posts.back().qp == &rig.app_qp);
}

// The standby is not usable (its port went down), then the primary's port goes down too: the QP
// waits, the request posted meanwhile (0x51) held.
static void lose_both_ports_with_a_request_held(Rig& rig) {
  rig.e->grace_ns = kGraceNs;
  rig.e->port_stable_ns = 0;
  vf::failover::periodic_work(*rig.e);
  vf::failover::on_port_change(*rig.e, 1, 1, IBV_PORT_DOWN);
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->path_wait.active);
  const std::size_t posts = g_posts.size();
  rig.post_send(0x51);
  CHECK(g_posts.size() == posts);  // held while the port is down
}

TEST_CASE("A port that blinks with no error seen: the QP goes on where it is", "[engine]") {
  Rig rig;
  lose_both_ports_with_a_request_held(rig);
  const std::size_t posts = g_posts.size();
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_ACTIVE);
  vf::failover::periodic_work(*rig.e);  // its port is back and stable (0 ms here)
  CHECK_FALSE(rig.p->path_wait.active);
  REQUIRE(g_posts.size() == posts + 1);
  CHECK(g_posts.back().qp == &rig.app_qp);
  CHECK(rig.v->mode() == vf::PostMode::kDirect);  // the healthy path's direct posts again
  CHECK_FALSE(rig.p->ended);
  CHECK_FALSE(rig.v->application_failed.load());
  CHECK(stashed(rig).empty());
}

TEST_CASE("A grace that runs out with the port still down shows the failure, for good",
          "[engine]") {
  Rig rig;
  lose_both_ports_with_a_request_held(rig);
  rig.post_send(0x52);
  const std::size_t posts = g_posts.size();
  rig.p->path_wait.until_ns = 1;
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->path_wait.active);
  CHECK(rig.p->ended);
  CHECK(rig.v->application_failed.load());
  CHECK(g_posts.size() == posts);  // not sent into the dead port
  // No error of the QP was seen: its oldest request fails as it would have on the dead path, the
  // rest flush (an RC QP does not go to ERR with flushes alone).
  const std::vector<ibv_wc> shown = stashed(rig);
  REQUIRE(shown.size() == 2);
  CHECK(shown[0].wr_id == 0x51);
  CHECK(shown[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(shown[1].wr_id == 0x52);
  CHECK(shown[1].status == IBV_WC_WR_FLUSH_ERR);
  // Its QP is in ERR: nothing succeeds after the flush, even if the port comes back.
  REQUIRE_FALSE(g_modifies.empty());
  CHECK(g_modifies.back().qp == &rig.app_qp);
  CHECK(g_modifies.back().state == IBV_QPS_ERR);
}

TEST_CASE("An application that resets its QP during a wait gets nothing of what it held",
          "[engine]") {
  Rig rig;
  fail_back_onto_a_port_that_went_down(rig);
  rig.post_send(0x42);
  CHECK_FALSE(primary_error_shown(rig, 0x40, IBV_WC_RETRY_EXC_ERR));
  (void)stashed(rig);  // the failback's own completions
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &attr, IBV_QP_STATE,
                                      fake_modify_qp) == 0);
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->path_wait.active);
  CHECK(stashed(rig).empty());
}

TEST_CASE("A grace that runs out on the standby with only held requests fails the oldest as the "
          "dead path would",
          "[engine]") {
  Rig rig;
  rig.e->grace_ns = kGraceNs;
  rig.e->port_stable_ns = 0;
  rig.fail_over_and_rearm();
  REQUIRE(rig.v->send_ring().outstanding() == 0);
  // The primary's port goes down (nothing to switch: the standby carries the traffic), then the
  // standby's: the QP waits, what it posts is held.
  g_port_state = IBV_PORT_DOWN;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  vf::failover::on_port_change(*rig.e, 1, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->path_wait.active);
  const std::size_t posts = g_posts.size();
  rig.post_send(0x62);
  rig.post_send(0x63);
  CHECK(g_posts.size() == posts);
  rig.p->path_wait.until_ns = 1;
  vf::failover::periodic_work(*rig.e);
  CHECK(rig.p->ended);
  CHECK(rig.v->application_failed.load());
  // 0x62 fails as on the dead standby; 0x63 goes to the standby's QP in ERR, whose flush the
  // application gets (translated) when it comes.
  const std::vector<ibv_wc> shown = stashed(rig);
  REQUIRE(shown.size() == 1);
  CHECK(shown[0].wr_id == 0x62);
  CHECK(shown[0].status == IBV_WC_RETRY_EXC_ERR);
  REQUIRE(g_posts.size() == posts + 1);
  CHECK(g_posts.back().qp == &rig.standby_qp);
}

TEST_CASE("An application that moves its QP to ERR during a wait gets flushes only", "[engine]") {
  Rig rig;
  lose_both_ports_with_a_request_held(rig);
  rig.post_send(0x52);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  REQUIRE(vf::failover::modify_app_qp(*rig.e, rig.v, &rig.app_qp, &attr, IBV_QP_STATE,
                                      fake_modify_qp) == 0);
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->path_wait.active);
  CHECK(rig.v->application_failed.load());
  // Its own ERR: every request flushes, as RC flushes a QP moved to ERR (no transport error).
  const std::vector<ibv_wc> shown = stashed(rig);
  REQUIRE(shown.size() == 2);
  CHECK(shown[0].wr_id == 0x51);
  CHECK(shown[0].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(shown[1].wr_id == 0x52);
  CHECK(shown[1].status == IBV_WC_WR_FLUSH_ERR);
}
