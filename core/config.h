// Runtime configuration read from the environment. Parsing is pure (it takes a lookup function)
// so unit tests can drive every branch without touching the process environment.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log_level.h"

namespace vf {

struct Config {
  bool enabled = true;               // VERBS_FAILOVER=0 turns every hook into a direct call
  LogLevel log_level = LogLevel::kWarn;
  std::string log_file;              // empty: stderr; "%p" already expanded to the pid
  bool backtrace = false;            // VERBS_FAILOVER_BACKTRACE=1

  // Failover (docs/design.md §5).
  std::string pairs;                 // VERBS_FAILOVER_PAIRS, raw (parsed by device_pairs)
  std::string stats_file;            // VERBS_FAILOVER_STATS, "%p" expanded; empty: no stats file
  double stats_interval_s = 0;       // VERBS_FAILOVER_STATS_INTERVAL; 0: only at exit
  // VERBS_FAILOVER_QP_TIMEOUT: the IB transport timeout exponent (4.096 us * 2^n) given to the
  // primary physical QP when the application asks for a longer one.
  std::uint8_t qp_timeout = kDefaultQpTimeout;
  // VERBS_FAILOVER_CTRL_ADDRS="[port|first-last][@addr,addr...]": the control channel's TCP
  // ports, and peer addresses to try when a GID holds no IPv4 address (InfiniBand).
  std::uint16_t ctrl_port_first = kDefaultCtrlPortFirst;
  std::uint16_t ctrl_port_last = kDefaultCtrlPortLast;
  std::vector<std::string> ctrl_peer_addresses;  // dotted IPv4, validated
  bool failback = true;              // VERBS_FAILOVER_FAILBACK=0 stays on the standby path
  // VERBS_FAILOVER_PORT_STABLE_MS: how long a port that came back must stay ACTIVE before its
  // paths are re-armed (and traffic fails back to it): a flapping port is not used between flaps.
  std::uint32_t port_stable_ms = kDefaultPortStableMs;
  // VERBS_FAILOVER_GRACE_MS: how long a QP whose path failed, and whose other path is not usable
  // yet (being re-armed after a failback, its port down), waits for a path with its work held and
  // its errors hidden before the application sees the failure (0: at once).
  std::uint32_t grace_ms = kDefaultGraceMs;
  // VERBS_FAILOVER_PROBE_MS: how often the idle standby of each protected QP is probed over its
  // own data path (a zero-length RDMA WRITE; 0: never, a dead standby is then found only when a
  // failover needs it).
  std::uint32_t probe_ms = kDefaultProbeMs;

  // Optics that flap do so within seconds, and a port can report ACTIVE a moment before its data
  // path carries traffic; two seconds is short against a repair and long against one blink.
  static constexpr std::uint32_t kDefaultPortStableMs = 2000;
  static constexpr std::uint32_t kMaxPortStableMs = 600'000;
  // A re-arm takes milliseconds and a port that blinked is back in seconds; an application's own
  // RC timeout (NCCL's 20 with 7 retries: ~30 s) would report a dead link later than this.
  static constexpr std::uint32_t kDefaultGraceMs = 10'000;
  static constexpr std::uint32_t kMaxGraceMs = 600'000;
  // One packet and its acknowledgement per idle QP and second: nothing against the traffic,
  // and a dead standby is known within about 1.5 s (the period and the probe's retries).
  static constexpr std::uint32_t kDefaultProbeMs = 1000;
  static constexpr std::uint32_t kMaxProbeMs = 600'000;
  static constexpr std::uint8_t kDefaultQpTimeout = 14;        // 67 ms per try, ~0.5 s to RETRY_EXC
  // Not perftest's or rc_pingpong's default 18515: the shim starts listening when a device is
  // opened, before those programs bind their own port.
  static constexpr std::uint16_t kDefaultCtrlPortFirst = 18600;
  static constexpr std::uint16_t kDefaultCtrlPortLast = 18615;  // 16 processes per host
};

// One line per problem, each naming the variable and what it accepts; the caller prints them.
struct ConfigResult {
  Config config;
  std::vector<std::string> problems;
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

ConfigResult parse_config(const EnvLookup& env, int pid);

std::optional<LogLevel> parse_log_level(std::string_view text);
std::optional<bool> parse_bool(std::string_view text);
// Replaces every "%p" with the pid and "%%" with "%", like core_pattern does.
std::string expand_path_pattern(std::string_view pattern, int pid);

}  // namespace vf
