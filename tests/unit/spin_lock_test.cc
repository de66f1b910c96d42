// core/spin_lock.h: mutual exclusion, and service in arrival order — the property that lets the
// engine's thread take the lock of a CQ the application busy-polls (a poller that releases and
// re-takes the lock at once must wait behind a thread that was already waiting).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
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

// The bias (core/spin_lock.h, layer 2). The ThreadSanitizer build has none (it cannot see the
// membarrier fence), and says so; everywhere else this machine's kernel must offer it, or these
// tests would pass without exercising anything.
#ifndef VF_EXPECT_LOCK_BIAS
#define VF_EXPECT_LOCK_BIAS 1
#endif

namespace {

constexpr bool kExpectBias = VF_EXPECT_LOCK_BIAS != 0;

void take_and_release(vf::SpinLock& lock, std::uint32_t times) {
  for (std::uint32_t i = 0; i < times; ++i) {
    lock.lock();
    lock.unlock();
  }
}

}  // namespace

TEST_CASE("spin lock: the bias is available exactly where it is expected", "[spin_lock]") {
  REQUIRE(vf::SpinLock::bias_available() == kExpectBias);
}

TEST_CASE("spin lock: a thread that takes it again and again becomes its owner", "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock;
  take_and_release(lock, vf::SpinLock::kClaimStreak - 1);
  REQUIRE_FALSE(lock.biased_to_this_thread());
  take_and_release(lock, 1);
  REQUIRE(lock.biased_to_this_thread());
  // Another thread, however often it comes, never takes the bias over: it revokes each time.
  bool other_became_owner = true;
  std::thread other([&] {
    take_and_release(lock, 4 * vf::SpinLock::kClaimStreak);
    other_became_owner = lock.biased_to_this_thread();
  });
  other.join();
  REQUIRE_FALSE(other_became_owner);
  REQUIRE(lock.revocations() == 4 * vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
}

TEST_CASE("spin lock: the shim's own threads never become owners", "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock;
  bool shim_thread_owner = true;
  std::thread shim_thread([&] {
    vf::SpinLock::never_bias_this_thread();
    take_and_release(lock, 10 * vf::SpinLock::kClaimStreak);
    shim_thread_owner = lock.biased_to_this_thread();
  });
  shim_thread.join();
  REQUIRE_FALSE(shim_thread_owner);
  REQUIRE(lock.revocations() == 0);
  // The bias is still free for an application thread.
  take_and_release(lock, vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
}

TEST_CASE("spin lock: another thread waits while the owner is inside, then goes first",
          "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock;
  take_and_release(lock, vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
  std::atomic<bool> other_inside{false};
  std::vector<const char*> order;  // written under the lock
  lock.lock();                      // through the bias
  std::thread other([&] {
    lock.lock();
    other_inside.store(true);
    order.push_back("other");
    lock.unlock();
  });
  // The other thread holds the ticket and has revoked the bias (the owner sees `revoked`, and
  // from then on sees it until the other thread is out): it waits for the owner to leave.
  const bool queued =
      eventually([&] { return lock.waiters() == 1 && !lock.biased_to_this_thread(); });
  const bool excluded = !other_inside.load();
  // Like a busy poller: release and take it again at once. The revoked owner queues behind.
  lock.unlock();
  lock.lock();
  order.push_back("owner again");
  lock.unlock();
  other.join();
  REQUIRE(queued);
  REQUIRE(excluded);
  REQUIRE(order == std::vector<const char*>{"other", "owner again"});
  REQUIRE(lock.revocations() == 1);
  REQUIRE(lock.biased_to_this_thread());  // the bias comes back once the other thread is out
}

TEST_CASE("spin lock: the owner and revoking threads never share the critical section",
          "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock(UINT32_MAX);  // never switched off: every foreign acquisition revokes
  constexpr int kForeignThreads = 2;
  constexpr int kForeignRounds = 2'000;
  long counter = 0;  // deliberately not atomic: only the lock protects it
  int inside = 0;
  int overlaps = 0;
  // Long enough for an overlap to be seen; the compiler must re-read `inside` each time.
  const auto critical_section = [&] {
    if (++inside != 1) ++overlaps;
    for (int k = 0; k < 16; ++k) {
      asm volatile("" ::: "memory");
      if (inside != 1) ++overlaps;
    }
    ++counter;
    --inside;
  };
  std::atomic<bool> owner_ready{false};
  std::atomic<bool> foreign_done{false};
  long owner_rounds = 0;
  bool owner_kept_bias = false;
  // The owner takes it as fast as it can for as long as the others revoke: each revocation races
  // with an owner that is entering or inside. Without the membarrier fence (a mutant run), both
  // get in within a few hundred revocations here, and the lock then hangs or this test fails.
  std::thread owner([&] {
    take_and_release(lock, vf::SpinLock::kClaimStreak);
    owner_ready.store(lock.biased_to_this_thread());
    while (!foreign_done.load(std::memory_order_relaxed)) {
      lock.lock();
      critical_section();
      lock.unlock();
      ++owner_rounds;
    }
    owner_kept_bias = lock.biased_to_this_thread();
  });
  REQUIRE(eventually([&] { return owner_ready.load(); }));
  std::vector<std::thread> foreign;
  for (int t = 0; t < kForeignThreads; ++t) {
    foreign.emplace_back([&] {
      for (int i = 0; i < kForeignRounds; ++i) {
        lock.lock();
        critical_section();
        lock.unlock();
      }
    });
  }
  for (std::thread& thread : foreign) thread.join();
  foreign_done.store(true);
  owner.join();
  REQUIRE(overlaps == 0);
  REQUIRE(owner_rounds > 0);
  REQUIRE(counter == owner_rounds + kForeignThreads * kForeignRounds);
  REQUIRE(lock.revocations() == kForeignThreads * kForeignRounds);
  REQUIRE(owner_kept_bias);
}

TEST_CASE("spin lock: the bias is switched off for good once its revocations are spent",
          "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock(3);
  take_and_release(lock, vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
  std::thread([&] { take_and_release(lock, 3); }).join();
  REQUIRE(lock.bias_switched_off());
  REQUIRE(lock.revocations() == 3);
  // From now on everyone uses the ticket lock: no more revocations, no new owner.
  take_and_release(lock, 4 * vf::SpinLock::kClaimStreak);
  std::thread([&] { take_and_release(lock, 4 * vf::SpinLock::kClaimStreak); }).join();
  REQUIRE_FALSE(lock.biased_to_this_thread());
  REQUIRE(lock.revocations() == 3);
  REQUIRE(lock.bias_switched_off());
}

// Issue 19 item 11: the engine's thread revokes on every drain round and on each of its passes
// that touch a QP, so a budget it could spend would switch the bias off for good after one
// failover, and the healthy path would stay slower after the failback.
TEST_CASE("spin lock: the shim's own threads revoke without spending the budget", "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock(3);
  take_and_release(lock, vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
  std::thread([&] {
    vf::SpinLock::never_bias_this_thread();
    take_and_release(lock, 10);
  }).join();
  CHECK(lock.revocations() == 10);
  CHECK_FALSE(lock.bias_switched_off());
  CHECK(lock.biased_to_this_thread());
  // An application thread still spends it.
  std::thread([&] { take_and_release(lock, 3); }).join();
  CHECK(lock.bias_switched_off());
}

// Review of acb1636, finding 3: the shim's threads have a budget of their own, so that a storm of
// their revocations (a drain that waits, a retry loop) ends.
TEST_CASE("spin lock: the shim's own threads have a budget of their own", "[spin_lock]") {
  if (!kExpectBias) return;
  vf::SpinLock lock;
  take_and_release(lock, vf::SpinLock::kClaimStreak);
  REQUIRE(lock.biased_to_this_thread());
  std::thread([&] {
    vf::SpinLock::never_bias_this_thread();
    take_and_release(lock, vf::SpinLock::kShimRevocationBudget);
  }).join();
  CHECK(lock.bias_switched_off());
  CHECK(lock.revocations() == vf::SpinLock::kShimRevocationBudget);
}
