// A per-object lock for the data path. Each protected QP, each CQ and each SRQ has its own (never
// one shared by several QPs), so threads posting on different QPs never meet; the engine's thread
// takes it only for short critical sections.
//
// Two layers (docs/design.md §5b):
//
// 1. A ticket lock, the lock every thread can always use: one atomic add to take, one store to
//    release. Why a ticket lock and not a test-and-set one: the engine's thread must get the lock
//    of a CQ that the application busy-polls. With test-and-set, the poller takes the lock again
//    right after each release and holds it most of the time; on a machine with fewer CPUs than
//    busy threads (one-vCPU guests, oversubscribed hosts) the engine then found it held at each of
//    its turns on the CPU and waited 40-170 ms per acquisition during a switch (lab logs, SRQ
//    scenario, 16 QPs on one CQ). A ticket is served in order: once the engine holds one, the
//    poller's next lock() waits behind it. A waiter yields the CPU after a short spin, so a holder
//    (or a waiter ahead of it) that was descheduled gets to run.
//
// 2. A bias for the one application thread that uses the object (NCCL's proxy thread, perftest's
//    only thread): that owner gets in with two plain stores and a load, no locked instruction.
//    A locked add costs 6-14 ns on the VMs we measured (bench/README.md) and the poll that reaps
//    a send completion takes two locks, which alone broke the 25 ns budget. This is the
//    asymmetric Dekker handshake: the owner announces itself (`owner_inside_ = 1`) and then reads
//    `revoked_` with no fence between; any other thread takes the ticket lock, sets `revoked_`,
//    and calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which runs a full fence on every CPU
//    running one of our threads — the fence the owner skipped — and then waits for
//    `owner_inside_ == 0`. Either the owner saw `revoked_` and backs off into the ticket queue, or
//    the revoker sees it inside and waits: never both inside.
//    Rules that keep it safe:
//    - The bias is claimed once, under the ticket lock, by a thread that took the lock
//      kClaimStreak times in a row, and never moves to another live thread: an old owner that
//      had just read "I am the owner" could otherwise still set the shared `owner_inside_` and
//      erase the new owner's flag when backing out.
//    - Each revocation costs a syscall that interrupts our other CPUs (~11-15 us here), so after
//      kRevocationBudget of them by application threads the bias is switched off for good:
//      `revoked_` stays 1 and the lock is the ticket lock alone. A workload where two threads
//      share an object pays this a bounded number of times. The shim's own threads (a switch,
//      the engine's passes) spend a budget of their own, kShimRevocationBudget: the bias must
//      survive many failovers (the healthy path after a failback is as fast as before), and a
//      storm of them must still end.
//    - Threads of the shim itself (engine, port monitor) never claim it (never_bias_this_thread).
//    - A shim thread that inherits a dead owner's thread pointer inherits the bias too (the fast
//      path does not look at never_bias_this_thread): a cost (revocations until the budget is
//      spent), never a second thread inside.
//    - No bias where membarrier is unavailable (old kernel, seccomp) or under ThreadSanitizer,
//      which cannot see a fence issued by another CPU through a syscall.
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
  // Consecutive acquisitions by one thread after which it becomes the owner.
  static constexpr std::uint32_t kClaimStreak = 8;
  // Revocations (membarrier calls) a lock may spend before its bias is switched off for good.
  static constexpr std::uint32_t kRevocationBudget = 128;
  // The same for the shim's own threads (never_bias_this_thread): a switch spends a few per lock.
  static constexpr std::uint32_t kShimRevocationBudget = 8192;
  static_assert(kShimRevocationBudget > kRevocationBudget);
  static_assert(kClaimStreak >= 2, "one acquisition says nothing about who uses the object");
  static_assert(kRevocationBudget >= 1);

  SpinLock() noexcept = default;
  // Tests give a smaller or larger budget; the data path uses the default.
  explicit SpinLock(std::uint32_t revocation_budget) noexcept
      : revocation_budget_(revocation_budget) {}
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void lock() noexcept {
    if (__builtin_expect(owner_.load(std::memory_order_relaxed) == self(), 1)) {
      owner_inside_.store(1, std::memory_order_relaxed);
      // Only the compiler must keep the store before the load; the CPU's store-load fence is
      // supplied by the revoker's membarrier.
      std::atomic_signal_fence(std::memory_order_seq_cst);
      if (__builtin_expect(revoked_.load(std::memory_order_acquire) == 0, 1)) {
        held_by_owner_.store(true, std::memory_order_relaxed);
        return;
      }
      owner_inside_.store(0, std::memory_order_release);
    }
    lock_slow();
  }

  void unlock() noexcept {
    if (held_by_owner_.load(std::memory_order_relaxed)) {
      held_by_owner_.store(false, std::memory_order_relaxed);
      owner_inside_.store(0, std::memory_order_release);
      return;
    }
    unlock_slow();
  }

  // Threads waiting for it (besides the holder). For tests and diagnostics; racy by nature.
  std::uint32_t waiters() const noexcept {
    // serving_ first: it never passes next_, so the difference cannot wrap.
    const std::uint32_t served = serving_.load(std::memory_order_relaxed);
    const std::uint32_t queued = next_.load(std::memory_order_relaxed) - served;
    // Held through the bias, everyone in the ticket queue (the revoker included) waits.
    if (held_by_owner_.load(std::memory_order_relaxed)) return queued;
    return queued > 1 ? queued - 1 : 0;
  }

  // Diagnostics for tests and benchmarks.
  bool biased_to_this_thread() const noexcept {
    return owner_.load(std::memory_order_relaxed) == self() &&
           revoked_.load(std::memory_order_relaxed) == 0;
  }
  bool bias_switched_off() const noexcept {
    return owner_.load(std::memory_order_relaxed) == kSwitchedOff;
  }
  std::uint32_t revocations() const noexcept {
    return revocations_.load(std::memory_order_relaxed);
  }

  // The calling thread never becomes an owner (the shim's engine and port-monitor threads: they
  // take many locks in a row during a switch, and a bias there would make every application
  // acquisition a revocation).
  static void never_bias_this_thread() noexcept;
  // Whether this process can use the bias at all (membarrier registered); cached.
  static bool bias_available() noexcept;

 private:
  // A thread's identity for the bias: its thread pointer, free to read, unique among live
  // threads. A dead owner's value may come back with a new thread, which is harmless: the dead
  // one is no longer inside.
  static std::uintptr_t self() noexcept {
    return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
  }
  // Never a thread pointer (they are aligned): the bias is off for good.
  static constexpr std::uintptr_t kSwitchedOff = 1;

  void lock_slow() noexcept;
  void unlock_slow() noexcept;
  void take_ticket() noexcept {
    const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
    if (__builtin_expect(serving_.load(std::memory_order_acquire) != ticket, 0)) wait_for(ticket);
  }
  void release_ticket() noexcept {
    serving_.store(serving_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  void wait_for(std::uint32_t ticket) noexcept;
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  // The owner's side, on the data path.
  std::atomic<std::uintptr_t> owner_{0};        // 0 (none yet), a thread pointer, kSwitchedOff
  std::atomic<std::uint32_t> owner_inside_{0};  // written by the owner only
  std::atomic<std::uint32_t> revoked_{0};       // 1 while a non-owner holds it, or for good
  std::atomic<bool> held_by_owner_{false};      // how the holder got in (read by the holder)
  // The ticket lock.
  std::atomic<std::uint32_t> next_{0};     // the ticket the next lock() takes
  std::atomic<std::uint32_t> serving_{0};  // the ticket that holds the lock
  // Under the ticket lock: who took it last and how many times in a row; this holder's revoke.
  std::uintptr_t streak_thread_ = 0;
  std::uint32_t streak_ = 0;
  bool holder_revoked_ = false;
  std::atomic<std::uint32_t> revocations_{0};  // written under the ticket lock
  std::uint32_t charged_revocations_ = 0;       // those of application threads (the budget's)
  std::uint32_t shim_revocations_ = 0;          // those of the shim's threads
  const std::uint32_t revocation_budget_ = kRevocationBudget;
};

}  // namespace vf
