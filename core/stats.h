// The failover statistics file (VERBS_FAILOVER_STATS): a snapshot of every device and QP the shim
// tracks, rendered as JSON, and the atomic writer that replaces the file so a reader never sees
// half of it. Pure: the shim fills a StatsSnapshot; nothing here touches verbs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vf {

// One switch of a QP between its paths.
struct SwitchEvent {
  std::string kind;    // "failover" | "failback"
  std::string reason;  // e.g. "port_down", "error_completion", "peer_request", "failback"
  std::string from;    // "primary" | "standby"
  std::string to;
  std::uint64_t detected_unix_ns = 0;
  std::uint64_t resumed_unix_ns = 0;  // 0: traffic has not resumed yet ("ms" renders null)
  std::uint64_t replayed_wrs = 0;
};

struct QpStats {
  std::uint32_t qpn = 0;
  std::string device;                 // "rxe0/1": device/port of the primary path
  std::optional<std::string> backup;  // "rxe1/1"; nullopt renders null
  // Whom the pair's other end belongs to: "self" (a QP connected to itself, NCCL's flush QP),
  // "this_process" (another QP of this process), "other_process"; nullopt (null) until paired.
  std::optional<std::string> peer;
  bool is_protected = false;          // rendered as "protected"
  std::string path;                   // "primary" | "standby"
  std::string state;                  // pairing, unpaired, primary, switching, standby, unprotected
  std::string unprotected_reason;     // empty when protected
  std::uint64_t failovers = 0;
  std::uint64_t failbacks = 0;
  std::uint64_t replayed_wrs = 0;
  std::uint64_t hidden_error_completions = 0;
  std::uint64_t hidden_async_events = 0;
  std::uint64_t synthesized_completions = 0;
  std::uint64_t standby_probes = 0;          // probes of the idle standby (path_probe.h)
  std::uint64_t standby_probe_failures = 0;  // of which failed or went unanswered
  std::vector<SwitchEvent> events;
};

struct DeviceStats {
  std::string name;                   // "rxe0"
  std::uint32_t port = 0;
  std::string state;                  // "ACTIVE", "DOWN", ...
  std::optional<std::string> backup;  // "rxe1/1"; nullopt renders null
  std::uint64_t port_changes = 0;
  std::uint64_t hidden_async_events = 0;
};

struct StatsSnapshot {
  int pid = 0;
  std::string program;
  std::string reason;                 // "exit" | "interval"
  std::uint64_t written_unix_ms = 0;
  std::vector<DeviceStats> devices;
  std::vector<QpStats> qps;
};

// The whole file, ending in a newline. Totals are computed here: qps, protected_qps,
// unprotected_qps and the per-QP counters summed over `qps`; hidden_async_events sums devices and
// QPs. Strings are JSON-escaped (control characters as \uXXXX, invalid UTF-8 as U+FFFD).
std::string render_stats_json(const StatsSnapshot& snapshot);

// `text` as a JSON string literal, quotes included.
std::string json_quote(std::string_view text);

// Writes `content` to "<path>.tmp.<pid>.<n>" (n counts this process's writes, so concurrent
// writers never share one) and renames it over `path`, so readers see the old file or the new
// one, never a part. On failure returns false, removes the temporary file and sets
// `error` to a sentence naming the file and the system error.
bool write_file_atomically(const std::string& path, std::string_view content, std::string& error);

}  // namespace vf
