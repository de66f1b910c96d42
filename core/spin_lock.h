// A per-object lock for the data path: one uncontended atomic add to take, one store to release.
// Each protected QP and each CQ has its own (never one shared by several QPs), so threads posting
// on different QPs never meet; the engine's thread takes it only for short critical sections.
//
// Why a ticket lock and not a test-and-set one: the engine's thread must get the lock of a CQ
// that the application busy-polls. With test-and-set, the poller takes the lock again right
// after each release and holds it most of the time; on a machine with fewer CPUs than busy
// threads (one-vCPU guests, oversubscribed hosts) the engine then found it held at each of its
// turns on the CPU and waited 40-170 ms per acquisition during a switch (lab logs, SRQ scenario,
// 16 QPs on one CQ). A ticket is served in order: once the engine holds one, the poller's next
// lock() waits behind it. A waiter yields the CPU after a short spin, so a holder (or a waiter
// ahead of it) that was descheduled gets to run.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace vf {

class SpinLock {
 public:
  // Spins before a waiter starts yielding the CPU: long enough for any critical section of the
  // data path on a running holder (they are a few hundred instructions), short enough that a
  // descheduled holder costs the waiter little.
  static constexpr unsigned kSpinsBeforeYield = 256;

  void lock() noexcept {
    const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
    if (__builtin_expect(serving_.load(std::memory_order_acquire) != ticket, 0)) wait_for(ticket);
  }
  void unlock() noexcept {
    serving_.store(serving_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  // Threads waiting for it (besides the holder). For tests and diagnostics; racy by nature.
  std::uint32_t waiters() const noexcept {
    const std::uint32_t queued =
        next_.load(std::memory_order_relaxed) - serving_.load(std::memory_order_relaxed);
    return queued > 1 ? queued - 1 : 0;
  }

 private:
  [[gnu::noinline, gnu::cold]] void wait_for(std::uint32_t ticket) noexcept {
    for (unsigned spins = 0; serving_.load(std::memory_order_acquire) != ticket; ++spins) {
      if (spins < kSpinsBeforeYield) {
        pause();
      } else {
        sched_yield();
      }
    }
  }
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  std::atomic<std::uint32_t> next_{0};     // the ticket the next lock() takes
  std::atomic<std::uint32_t> serving_{0};  // the ticket that holds the lock
};

}  // namespace vf
