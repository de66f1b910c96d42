// Entry points for tests and bug reports, exported under the VERBS_FAILOVER_PRIVATE node.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/port_monitor.h"

// Lets the preload tests prove that a crash inside the shim prints a symbolised stack
// (VERBS_FAILOVER_BACKTRACE=1). Never called by the shim itself.
VF_EXPORT __attribute__((noinline)) void verbs_failover_debug_crash() {
  volatile int* null_pointer = nullptr;
  *null_pointer = 42;
}

VF_EXPORT const char* verbs_failover_version() { return VERBS_FAILOVER_VERSION; }

// Port state changes the shim's port monitor has seen on device/port; -1 if it does not watch
// that port. Lets tests wait for the monitor without reading its log.
VF_EXPORT long verbs_failover_debug_port_changes(const char* device, int port) {
  for (const vf::shim::PortStatus& status : vf::shim::watched_ports()) {
    if (status.device == device && status.port == port) return static_cast<long>(status.changes);
  }
  return -1;
}

// Whether the shim protects the application QP qpn: 1 yes, 0 no (its reason copied, cut to
// reason_size - 1 bytes and terminated, into reason when given), -1 it does not know that QP.
// Lets tests wait for what the stats file would say without a stats interval.
VF_EXPORT int verbs_failover_debug_qp_protected(std::uint32_t qpn, char* reason,
                                                std::size_t reason_size) {
  std::string why;
  const int state = vf::FailoverEngine::instance().protection_of(qpn, why);
  if (reason != nullptr && reason_size > 0) {
    const std::size_t length = std::min(why.size(), reason_size - 1);
    std::memcpy(reason, why.data(), length);
    reason[length] = '\0';
  }
  return state;
}

// The path the application QP qpn uses (0 primary, 1 standby, 2 switching; -1 the shim does not
// protect it), and how many failovers and failbacks it made (either pointer may be null). Lets a
// benchmark wait for a failback (bench/post_poll_bench.c --after-failback).
VF_EXPORT int verbs_failover_debug_qp_switches(std::uint32_t qpn, unsigned long* failovers,
                                               unsigned long* failbacks) {
  std::uint64_t over = 0, back = 0;
  const int path = vf::FailoverEngine::instance().switches_of(qpn, &over, &back);
  if (failovers != nullptr) *failovers = static_cast<unsigned long>(over);
  if (failbacks != nullptr) *failbacks = static_cast<unsigned long>(back);
  return path;
}

// Sets the re-arm retry interval (milliseconds, > 0): a test lengthens it to prove that a path
// comes back because of a notice, not because a retry came round. Returns 0, or -1 for 0 ms.
VF_EXPORT int verbs_failover_debug_set_rearm_retry_ms(unsigned int milliseconds) {
  if (milliseconds == 0) return -1;
  vf::FailoverEngine::instance().set_rearm_retry(std::uint64_t{milliseconds} * 1'000'000);
  return 0;
}

// Sets how long after a switch with work outstanding and nothing completed the shim describes
// the QP's paths in its log (milliseconds, > 0; default 5 s): a test shortens it to see the line
// without waiting. Returns 0, or -1 for 0 ms.
VF_EXPORT int verbs_failover_debug_set_resume_late_ms(unsigned int milliseconds) {
  if (milliseconds == 0) return -1;
  vf::FailoverEngine::instance().set_resume_late(std::uint64_t{milliseconds} * 1'000'000);
  return 0;
}

// Sets the first hold-down of a path that failed silently (milliseconds, > 0; default 10 s): a
// test shortens it to see the path re-armed and taken back once repaired. Returns 0, or -1 for 0.
VF_EXPORT int verbs_failover_debug_set_hold_down_ms(unsigned int milliseconds) {
  if (milliseconds == 0) return -1;
  vf::FailoverEngine::instance().set_first_hold_down(std::uint64_t{milliseconds} * 1'000'000);
  return 0;
}

// Loses the next `count` control messages of a kind ("FailoverReply", ...) this process sends,
// as a reply is lost when its session dies after the request was handled; count 0 only asks.
// Returns how many of that kind are still to lose, or -1 for an unknown kind.
VF_EXPORT int verbs_failover_debug_lose_control(const char* kind, unsigned int count) {
  if (kind == nullptr) return -1;
  return vf::FailoverEngine::instance().lose_control_messages(kind, count);
}
