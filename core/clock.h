// The two clocks the shim reads: monotonic for durations and deadlines, realtime for the stats
// (whose times are compared with fault times taken by other processes and hosts).
#pragma once

#include <time.h>

#include <cstdint>

namespace vf {

inline std::uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}
inline std::uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline std::uint64_t realtime_ns() { return clock_ns(CLOCK_REALTIME); }

}  // namespace vf
