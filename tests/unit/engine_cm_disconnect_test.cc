// rdma_cm's disconnect over the control channel (core/failover/cm_disconnect.h), on the rig of
// tests/unit/engine_rig.h: the side that disconnects tells the peer's shim and waits for its
// answer; the other side answers every request and hands the QP to the rdma_cm hooks once.
#include <thread>

#include "core/failover/cm_disconnect.h"
#include "tests/unit/engine_rig.h"

namespace {

std::vector<std::pair<ibv_qp*, std::uint32_t>> g_handed;
void record_handed(ibv_qp* qp, std::uint32_t qpn) {
  g_handed.emplace_back(qp, qpn);
}

vf::CmDisconnect from_peer(const Rig& rig, bool reply) {
  return vf::CmDisconnect{rig.p->remote, rig.p->local, reply};
}

}  // namespace

TEST_CASE("CmDisconnect from the peer: answered every time, handed to the hooks once",
          "[engine][rdma_cm]") {
  Rig rig;
  g_handed.clear();
  rig.e->cm_disconnect_handler = record_handed;
  rig.receive(from_peer(rig, false));
  rig.receive(from_peer(rig, false));  // its answer was lost: asked again
  const auto replies = rig.sent<vf::CmDisconnect>();
  REQUIRE(replies.size() == 2);
  for (const vf::CmDisconnect& reply : replies) {
    CHECK(reply.is_reply);
    CHECK(reply.local == rig.p->local);
    CHECK(reply.remote == rig.p->remote);
  }
  std::unique_lock lock(rig.e->mutex);
  // Not before the grace: the CM's own DISCONNECTED may still come on a working path.
  vf::failover::run_cm_disconnect_handler(*rig.e, lock);
  CHECK(g_handed.empty());
  REQUIRE(rig.e->cm_disconnects_due.size() == 1);
  rig.e->cm_disconnects_due[0].due_ns = 0;  // the grace passed
  vf::failover::run_cm_disconnect_handler(*rig.e, lock);
  REQUIRE(g_handed.size() == 1);
  CHECK(g_handed[0].first == &rig.app_qp);
  CHECK(g_handed[0].second == 17);
  // This side's own rdma_disconnect then tells nobody: the peer started it and may be gone.
  CHECK(vf::failover::announce_cm_disconnect(*rig.e, lock, rig.v, 120'000'000'000ull) ==
        vf::failover::CmAnnounce::kNotSent);
  CHECK(rig.e->cm_pending.empty());
}

TEST_CASE("CmDisconnect: the asker sends, resends until answered, and stops", "[engine][rdma_cm]") {
  Rig rig;
  std::unique_lock lock(rig.e->mutex);
  // wait 0: returns at once (unanswered), the request stays due for the engine's passes.
  CHECK(vf::failover::announce_cm_disconnect(*rig.e, lock, rig.v, 0) ==
        vf::failover::CmAnnounce::kUnanswered);
  REQUIRE(rig.e->cm_pending.size() == 1);
  rig.p->cm.until_ns = UINT64_MAX;  // as if the wait went on
  CHECK(vf::failover::send_cm_disconnects(*rig.e));
  auto requests = rig.sent<vf::CmDisconnect>();
  REQUIRE(requests.size() == 1);
  CHECK_FALSE(requests[0].is_reply);
  CHECK(requests[0].local == rig.p->local);
  CHECK(vf::failover::send_cm_disconnects(*rig.e));  // not yet due again
  CHECK(rig.sent<vf::CmDisconnect>().size() == 1);
  rig.p->cm.next_send_ns = 0;  // the resend period passed without an answer
  CHECK(vf::failover::send_cm_disconnects(*rig.e));
  CHECK(rig.sent<vf::CmDisconnect>().size() == 2);
  rig.e->local_inbox.clear();
  lock.unlock();
  rig.receive(from_peer(rig, true));
  lock.lock();
  CHECK(rig.p->cm.answered);
  CHECK_FALSE(vf::failover::send_cm_disconnects(*rig.e));
  CHECK(rig.e->cm_pending.empty());
  CHECK(rig.sent<vf::CmDisconnect>().empty());
}

TEST_CASE("CmDisconnect: the application's thread waits until the answer, not its bound",
          "[engine][rdma_cm]") {
  Rig rig;
  // A bound longer than the test's own timeout: a wait that only the bound ends fails the test.
  // The answer is injected only once the request is queued and the lock released: a call that
  // did not wait would have returned kUnanswered by then.
  auto result = vf::failover::CmAnnounce::kNotSent;
  std::thread application([&] {
    std::unique_lock lock(rig.e->mutex);
    result = vf::failover::announce_cm_disconnect(*rig.e, lock, rig.v, 120'000'000'000ull);
  });
  // The engine's thread: sends once the request is queued, then the peer's answer arrives.
  for (;;) {
    std::unique_lock lock(rig.e->mutex);
    if (!rig.e->cm_pending.empty()) {
      vf::failover::send_cm_disconnects(*rig.e);
      break;
    }
    lock.unlock();
    std::this_thread::yield();
  }
  {
    std::lock_guard lock(rig.e->mutex);
    rig.receive(from_peer(rig, true));
  }
  application.join();
  CHECK(result == vf::failover::CmAnnounce::kAnswered);
  CHECK(rig.p->cm.answered);
  // This side's own DISCONNECTED is due after the grace (the CM's answer may not come).
  REQUIRE(rig.e->cm_disconnects_due.size() == 1);
  CHECK(rig.e->cm_disconnects_due[0].qp == &rig.app_qp);
  CHECK(rig.e->cm_disconnects_due[0].qpn == 17);
}

TEST_CASE("CmDisconnect for a QP that is not paired with another shim sends nothing",
          "[engine][rdma_cm]") {
  Rig rig;
  std::unique_lock lock(rig.e->mutex);
  rig.p->self_connected = true;
  CHECK(vf::failover::announce_cm_disconnect(*rig.e, lock, rig.v, 120'000'000'000ull) ==
        vf::failover::CmAnnounce::kNotSent);
  rig.p->self_connected = false;
  rig.p->paired = false;
  CHECK(vf::failover::announce_cm_disconnect(*rig.e, lock, rig.v, 120'000'000'000ull) ==
        vf::failover::CmAnnounce::kNotSent);
  CHECK(rig.e->cm_pending.empty());
}

TEST_CASE("CmDisconnect about a QP destroyed here is answered all the same", "[engine][rdma_cm]") {
  Rig rig;
  // The peer names a QP this process does not have (any more): its sender must not wait.
  vf::CmDisconnect request{{33, gid(3)}, {4242, gid(1)}, false};
  rig.receive(request);
  const auto replies = rig.sent<vf::CmDisconnect>();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].is_reply);
  CHECK(replies[0].local == request.remote);
  CHECK(replies[0].remote == request.local);
  // An answer about an unknown QP is dropped without a reply of its own.
  rig.e->local_inbox.clear();
  rig.receive(vf::CmDisconnect{{33, gid(3)}, {4242, gid(1)}, true});
  CHECK(rig.sent<vf::CmDisconnect>().empty());
}
