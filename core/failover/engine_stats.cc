#include "core/failover/engine_stats.h"

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

void mix(std::uint64_t& digest, std::uint64_t value) {
  digest ^= value + 0x9e3779b97f4a7c15ull + (digest << 6) + (digest >> 2);
}

// What the file says, less its time stamp and reason, folded into one number. A stats file that
// a rank ended by SIGTERM leaves behind (no exit handler runs) must hold every switch it made:
// the engine rewrites the file when this changes.
std::uint64_t stats_digest(const Engine& e) {
  std::uint64_t digest = 0;
  for (int i = 0; i < e.device_count; ++i) {
    const Device& d = e.devices[i];
    for (std::uint8_t port = 1; port <= d.port_count; ++port) {
      mix(digest, static_cast<std::uint64_t>(d.ports[port].state));
      mix(digest, d.ports[port].changes);
      mix(digest, d.ports[port].hidden_async_events.load(std::memory_order_relaxed));
    }
  }
  for (const auto& [key, p] : e.protections) {
    const VirtualQp& v = *p.qp;
    mix(digest, v.vqpn);
    mix(digest, (p.paired ? 1u : 0u) | (p.pairing ? 2u : 0u) | (p.sw.in_progress ? 4u : 0u) |
                    (static_cast<unsigned>(v.active_path()) << 3));
    mix(digest, std::hash<std::string>{}(p.unprotected_reason));
    mix(digest, p.failovers);
    mix(digest, p.failbacks);
    mix(digest, p.probe.failures);  // not the probes sent: the file is not rewritten for each
    mix(digest, p.events.size());
    mix(digest, v.counters.replayed_wrs.load(std::memory_order_relaxed));
    mix(digest, v.counters.hidden_error_completions.load(std::memory_order_relaxed));
    mix(digest, v.counters.hidden_async_events.load(std::memory_order_relaxed));
    mix(digest, v.counters.synthesized_completions.load(std::memory_order_relaxed));
    mix(digest, v.counters.resumed_unix_ns.load(std::memory_order_relaxed));
  }
  mix(digest, e.unprotected.size());
  return digest;
}

}  // namespace

bool stats_changed(const Engine& e) {
  return e.stats_written_digest != stats_digest(e);
}

void write_stats(Engine& e, const char* reason) {
  if (e.config.stats_file.empty()) return;
  std::lock_guard file_lock(e.stats_file_mutex);
  if (e.stats_final) return;  // the exit handler wrote the last word
  if (std::string_view(reason) == "exit") e.stats_final = true;
  StatsSnapshot snapshot;
  {
    std::lock_guard lock(e.mutex);
    e.stats_written_digest = stats_digest(e);
    snapshot.pid = static_cast<int>(::getpid());
    snapshot.program = e.program;
    snapshot.reason = reason;
    snapshot.written_unix_ms = realtime_ns() / 1000000;
    for (int i = 0; i < e.device_count; ++i) {
      const Device& d = e.devices[i];
      for (std::uint8_t port = 1; port <= d.port_count; ++port) {
        DeviceStats stats;
        stats.name = d.name;
        stats.port = port;
        stats.state = port_state_name(d.ports[port].state);
        if (d.ports[port].backup_device >= 0) {
          stats.backup = fmt::format("{}/{}", e.devices[d.ports[port].backup_device].name,
                                     d.ports[port].backup_port);
        }
        stats.port_changes = d.ports[port].changes;
        stats.hidden_async_events = d.ports[port].hidden_async_events.load();
        snapshot.devices.push_back(stats);
      }
    }
    for (auto& [key, p] : e.protections) {
      const VirtualQp& v = *p.qp;
      QpStats stats;
      stats.qpn = v.vqpn;
      stats.device = fmt::format("{}/{}", e.devices[v.path[kPrimary].device_index].name,
                                 v.path[kPrimary].port);
      stats.backup = fmt::format("{}/{}", e.devices[v.path[kStandby].device_index].name,
                                 v.path[kStandby].port);
      if (p.paired) {
        stats.peer = p.self_connected ? "self" : p.peer.local ? "this_process" : "other_process";
      }
      stats.is_protected = p.paired && p.unprotected_reason.empty();
      stats.path = p.sw.in_progress ? "switching" : path_name(v.active_path());
      stats.state = !p.paired          ? (p.pairing ? "pairing" : "unpaired")
                    : p.sw.in_progress ? "switching"
                    : !p.unprotected_reason.empty()
                        ? "unprotected"
                        : (v.active_path() == kPrimary ? "primary" : "standby");
      stats.unprotected_reason = p.unprotected_reason;
      stats.failovers = p.failovers;
      stats.failbacks = p.failbacks;
      stats.replayed_wrs = v.counters.replayed_wrs.load();
      stats.hidden_error_completions = v.counters.hidden_error_completions.load();
      stats.hidden_async_events = v.counters.hidden_async_events.load();
      stats.synthesized_completions = v.counters.synthesized_completions.load();
      stats.standby_probes = p.probe.sent;
      stats.standby_probe_failures = p.probe.failures;
      stats.events = p.events;
      if (p.pending_event != UINT32_MAX && v.counters.resumed_unix_ns.load() != 0) {
        stats.events[p.pending_event].resumed_unix_ns = v.counters.resumed_unix_ns.load();
      }
      snapshot.qps.push_back(std::move(stats));
    }
    for (const auto& [qpn, why] : e.unprotected) {
      QpStats stats;
      stats.qpn = qpn;
      stats.is_protected = false;
      stats.path = "primary";
      stats.state = "unprotected";
      stats.unprotected_reason = why;
      snapshot.qps.push_back(std::move(stats));
    }
  }
  std::string error;
  if (!write_file_atomically(e.config.stats_file, render_stats_json(snapshot), error)) {
    VF_LOG_WARN("stats: {}", error);
    return;
  }
  VF_LOG_DEBUG("stats: {} written ({})", e.config.stats_file, reason);
}

int protection_of(Engine& e, std::uint32_t qpn, std::string& reason) {
  for (auto& [key, p] : e.protections) {
    if (p.destroyed || p.qp->vqpn != qpn) continue;
    reason = !p.paired ? "not paired" : p.unprotected_reason;
    return p.paired && p.unprotected_reason.empty() ? 1 : 0;
  }
  for (const auto& [unprotected_qpn, why] : e.unprotected) {
    if (unprotected_qpn != qpn) continue;
    reason = why;
    return 0;
  }
  return -1;
}

int switches_of(Engine& e, std::uint32_t qpn, std::uint64_t* failovers, std::uint64_t* failbacks) {
  for (auto& [key, p] : e.protections) {
    if (p.destroyed || p.qp->vqpn != qpn) continue;
    *failovers = p.failovers;
    *failbacks = p.failbacks;
    return p.sw.in_progress ? 2 : p.qp->active_path();
  }
  return -1;
}

}  // namespace vf::failover
