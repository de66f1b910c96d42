// Issue 19 item 11: the first failover must not slow the healthy path for good. After the
// failback, ibv_poll_cq stops polling the shadow CQ (unless another QP of the CQ still runs on the
// standby), and the engine's passes leave a QP's lock alone while nothing waits to be posted
// (each acquisition by the engine's thread revokes the application thread's bias: a membarrier).
// bench/run.sh --after-failback measures the result. On the rig of tests/unit/engine_rig.h.
#include <thread>

#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

void fail_back(Rig& rig) {
  rig.deliver(rig.failback_request_from_peer(2));
  REQUIRE_FALSE(rig.p->sw.in_progress);
  REQUIRE(rig.v->active_path() == vf::kPrimary);
}

}  // namespace

TEST_CASE("After the failback, polls no longer look at the shadow CQ", "[engine]") {
  Rig rig;
  rig.fail_over_and_rearm();
  CHECK(rig.cq_state->shadow_active.load());
  fail_back(rig);
  CHECK(rig.v->mode() == vf::PostMode::kDirect);
  CHECK_FALSE(rig.cq_state->shadow_active.load());
  CHECK(rig.p->failbacks == 1);
}

TEST_CASE("A CQ another QP of which still runs on the standby keeps polling the shadow",
          "[engine]") {
  Rig rig;
  ibv_qp other_qp{};
  other_qp.qp_num = 19;
  other_qp.context = &rig.contexts[0];
  other_qp.state = IBV_QPS_RTS;
  ibv_qp_cap cap{};
  cap.max_send_wr = cap.max_recv_wr = 4;
  cap.max_send_sge = cap.max_recv_sge = 1;
  auto other = std::make_unique<vf::VirtualQp>(&other_qp, &g_ops, cap, false, rig.cq_state.get(),
                                               rig.cq_state.get());
  other->set_active_path(vf::kStandby);
  vf::VirtualQp* key = other.get();
  rig.e->protections[key].qp = std::move(other);
  rig.fail_over_and_rearm();
  fail_back(rig);
  CHECK(rig.cq_state->shadow_active.load());
}

TEST_CASE("The engine's passes leave a QP's lock alone while nothing waits to be posted",
          "[engine]") {
  if (!vf::SpinLock::bias_available()) return;  // no bias to revoke (TSan, old kernels)
  Rig rig;
  rig.fail_over_and_rearm();
  rig.p->rearm[vf::kPrimary].needed = true;  // the pair waits for its primary: passes go on
  // This thread is the application's: it becomes the owner of the QP's lock.
  for (std::uint32_t i = 0; i < vf::SpinLock::kClaimStreak; ++i) {
    rig.v->lock().lock();
    rig.v->lock().unlock();
  }
  REQUIRE(rig.v->lock().biased_to_this_thread());
  const std::uint32_t before = rig.v->lock().revocations();
  std::thread engine([&] {
    vf::SpinLock::never_bias_this_thread();
    for (int pass = 0; pass < 20; ++pass) vf::failover::periodic_work(*rig.e);
  });
  engine.join();
  CHECK(rig.v->lock().revocations() - before == 0);
  CHECK(rig.v->lock().biased_to_this_thread());
}

// Review of acb1636, finding 4: a retry the engine owes must keep it awake (it sleeps without a
// timeout when nothing is pending), and a retry that is due does take the lock.
TEST_CASE("Something left unposted keeps the engine's passes coming until it is posted",
          "[engine]") {
  Rig rig;
  rig.fail_over_and_rearm();
  rig.p->pending_event = UINT32_MAX;  // its traffic resumed: nothing else keeps the engine awake
  REQUIRE_FALSE(vf::failover::has_pending_work(*rig.e));
  rig.v->post_retry_due.store(true);
  CHECK(vf::failover::has_pending_work(*rig.e));
  vf::failover::periodic_work(*rig.e);  // retries: the rig's standby takes everything
  CHECK_FALSE(rig.v->post_retry_due.load());
  CHECK_FALSE(vf::failover::has_pending_work(*rig.e));
}
