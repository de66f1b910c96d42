// core/spin_lock.h: mutual exclusion, and service in arrival order — the property that lets the
// engine's thread take the lock of a CQ the application busy-polls (a poller that releases and
// re-takes the lock at once must wait behind a thread that was already waiting).
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "core/spin_lock.h"

namespace {

// Bounded wait for a condition another thread makes true; a hang fails the test, not the run.
template <typename Condition>
bool eventually(Condition&& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("spin lock: a waiter gets the lock before its holder takes it again", "[spin_lock]") {
  vf::SpinLock lock;
  std::vector<const char*> order;  // written under the lock
  lock.lock();
  std::thread waiter([&] {
    lock.lock();
    order.push_back("waiter");
    lock.unlock();
  });
  const bool queued = eventually([&] { return lock.waiters() == 1; });
  // Like a busy poller: release and take it again at once.
  lock.unlock();
  lock.lock();
  order.push_back("holder again");
  lock.unlock();
  waiter.join();
  REQUIRE(queued);
  REQUIRE(order == std::vector<const char*>{"waiter", "holder again"});
  REQUIRE(lock.waiters() == 0);
}

TEST_CASE("spin lock: threads that contend never share the critical section", "[spin_lock]") {
  vf::SpinLock lock;
  // More threads than this machine's CPUs: waiters must yield for a descheduled holder.
  const unsigned threads = std::max(4u, 2 * std::thread::hardware_concurrency());
  constexpr int kRounds = 20'000;
  long counter = 0;  // deliberately not atomic: only the lock protects it
  int inside = 0;
  int overlaps = 0;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        lock.lock();
        if (++inside != 1) ++overlaps;
        ++counter;
        --inside;
        lock.unlock();
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  REQUIRE(overlaps == 0);
  REQUIRE(counter == static_cast<long>(threads) * kRounds);
}
