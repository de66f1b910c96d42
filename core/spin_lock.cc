// The slow paths of core/spin_lock.h: the ticket queue, claiming the bias, revoking it.
#include "core/spin_lock.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace vf {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kBuiltForThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kBuiltForThreadSanitizer = true;
#else
constexpr bool kBuiltForThreadSanitizer = false;
#endif
#else
constexpr bool kBuiltForThreadSanitizer = false;
#endif

thread_local bool t_never_bias = false;

long membarrier(int command) { return syscall(__NR_membarrier, command, 0u, 0); }

bool register_membarrier() {
  if (kBuiltForThreadSanitizer) return false;
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  // Registration belongs to the address space: it survives fork() (checked on this kernel) and
  // ends with exec(), which ends this library's state too.
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

// A full fence on every CPU that runs a thread of this process: the one the owner's fast path
// skips. False if the kernel refused (not expected once registered; see revoke()).
bool fence_all_our_cpus() {
  for (;;) {
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
    if (errno != EINTR && errno != EAGAIN) return false;
  }
}

}  // namespace

void SpinLock::never_bias_this_thread() noexcept { t_never_bias = true; }

bool SpinLock::bias_available() noexcept {
  // 0: not asked yet, 1: available, 2: not. Two threads asking at once both register: harmless.
  static std::atomic<int> state{0};
  int known = state.load(std::memory_order_acquire);
  if (known == 0) {
    known = register_membarrier() ? 1 : 2;
    state.store(known, std::memory_order_release);
  }
  return known == 1;
}

void SpinLock::wait_for(std::uint32_t ticket) noexcept {
  for (unsigned spins = 0; serving_.load(std::memory_order_acquire) != ticket; ++spins) {
    if (spins < kSpinsBeforeYield) {
      pause();
    } else {
      sched_yield();
    }
  }
}

void SpinLock::lock_slow() noexcept {
  take_ticket();
  const std::uintptr_t me = self();
  const std::uintptr_t owner = owner_.load(std::memory_order_relaxed);
  if (owner != 0 && owner != kSwitchedOff && owner != me) {
    // A live owner may be inside, or about to enter on a `revoked_ == 0` it reads now.
    revoked_.store(1, std::memory_order_relaxed);
    if (!fence_all_our_cpus()) {
      // The kernel took our registration and now refuses the command: not expected. Switch the
      // bias off for good (`revoked_` stays 1) and give a store buffer far more than the time it
      // takes to drain before trusting `owner_inside_` (a timing argument, not a fence: only this
      // one revocation relies on it).
      owner_.store(kSwitchedOff, std::memory_order_relaxed);
      timespec drain{0, 1'000'000};
      while (nanosleep(&drain, &drain) != 0 && errno == EINTR) {
      }
    }
    for (unsigned spins = 0; owner_inside_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < kSpinsBeforeYield) {
        pause();
      } else {
        sched_yield();
      }
    }
    revocations_.store(revocations_.load(std::memory_order_relaxed) + 1,
                       std::memory_order_relaxed);
    // The shim's own threads revoke at the pace of switches and engine passes, not of the
    // application's calls: they do not spend the budget, which bounds what two application
    // threads sharing the object cost (otherwise one failover would switch the bias off for
    // good, and the healthy path would stay slower after the failback: issue 19 item 11).
    if (!t_never_bias) {
      ++charged_revocations_;
    } else {
      ++shim_revocations_;
    }
    // The shim's own threads have a budget of their own, far larger: a normal failover spends a
    // few dozen, a storm (a drain that waits, a retry loop) must still end the bias's cost.
    if (charged_revocations_ >= revocation_budget_ || shim_revocations_ >= kShimRevocationBudget ||
        owner_.load(std::memory_order_relaxed) == kSwitchedOff) {
      owner_.store(kSwitchedOff, std::memory_order_relaxed);  // `revoked_` stays 1 for good
    } else {
      holder_revoked_ = true;
    }
    streak_thread_ = 0;
    return;
  }
  if (owner != 0) return;  // the owner itself (a revoker was in), or the bias is off
  if (streak_thread_ == me) {
    ++streak_;
  } else {
    streak_thread_ = me;
    streak_ = 1;
  }
  // Claimed under the ticket lock, so no thread is on the fast path while it changes.
  if (streak_ >= kClaimStreak && !t_never_bias && bias_available()) {
    owner_.store(me, std::memory_order_relaxed);
  }
}

void SpinLock::unlock_slow() noexcept {
  if (holder_revoked_) {
    holder_revoked_ = false;
    // The owner may come back in (release: it sees what this holder wrote).
    revoked_.store(0, std::memory_order_release);
  }
  release_ticket();
}

}  // namespace vf
