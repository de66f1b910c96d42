// Process-wide state of the shim: configuration, the re-entry guard, fork handling.
#pragma once

#include <atomic>

#include "core/config.h"

namespace vf::shim {

namespace state_detail {
inline std::atomic<bool> g_initialized{false};
inline std::atomic<bool> g_active{true};
void initialize_slow();
}  // namespace state_detail

// Reads the environment once. Cheap after the first call; safe from any hook, before or after
// the constructor, from any thread.
inline void ensure_initialized() {
  if (!state_detail::g_initialized.load(std::memory_order_acquire)) state_detail::initialize_slow();
}

// False with VERBS_FAILOVER=0: every exported hook then calls the real verb directly and no
// ops table is patched, so the program runs as if the shim were not there.
inline bool shim_active() { return state_detail::g_active.load(std::memory_order_relaxed); }

const Config& config();

// libibverbs calls some of its own exports through its PLT (ibv_reg_mr -> ibv_reg_mr_iova2), so
// one call of the application can enter two hooks; only the outermost one does shim work.
class ReentryGuard {
 public:
  ReentryGuard() { ++depth_; }
  ~ReentryGuard() { --depth_; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  static bool inside() { return depth_ > 0; }

 private:
  static inline thread_local int depth_ = 0;
};

// Objects that must be consistent across fork() (locks the child would otherwise inherit held)
// register here; shim threads (none yet) are forgotten by the child.
struct ForkParticipant {
  void (*prepare)();
  void (*parent)();
  void (*child)();
};
// Only during initialisation (the shim's own modules register from initialize_slow).
void register_fork_participant(ForkParticipant participant);

}  // namespace vf::shim
