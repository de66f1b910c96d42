// How the workload reports a failure: one exception type carrying the message that ends up on the
// rank's FAIL line, and a process-wide abort flag so that, in single-process mode, the other rank
// threads stop promptly (with their own FAIL line) instead of waiting for their deadlines.
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>

namespace nccl_pattern {

struct WorkloadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Set by the first rank that fails; every wait loop checks it.
inline std::atomic<bool> g_abort_all{false};

[[noreturn]] inline void fail(const std::string& why) { throw WorkloadError(why); }

inline void throw_if_aborted() {
  if (g_abort_all.load(std::memory_order_relaxed)) fail("aborted: another rank of this process failed");
}

}  // namespace nccl_pattern
