// The life of one protected QP pair (docs/design.md §5) as an explicit state machine: which path
// carries traffic, and what may happen next. Pure: the shim feeds it events and acts on the
// state it returns, so every transition is testable without a NIC.
// Part of the failover work (issue "Transparent failover"); not used by the shim yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace vf {

enum class PathState : std::uint8_t {
  kUnpaired,     // created; no standby yet — runs as pass-through, reported unprotected
  kPairing,      // standby QP being created and exchanged with the peer's shim
  kPrimary,      // protected; traffic on the primary path
  kDraining,     // failover begun: primary stopped, its CQ drained, new posts queued
  kHandshake,    // waiting for the peer's count of delivered messages
  kStandby,      // traffic on the standby path (replay done)
  kFailingBack,  // primary healthy again; waiting for a quiescent point to switch back
  kUnprotected,  // pairing impossible (no backup, no peer shim): pass-through for good
  kDead,         // both paths failed: the application gets the error it would have got
};

enum class PathEvent : std::uint8_t {
  kPairingStarted,
  kPairingDone,
  kPairingFailed,
  kPrimaryFailed,   // port down, link-class error completion, or the peer's request
  kDrained,         // primary CQ drained
  kPeerCounts,      // the peer's delivered count arrived (replay can start)
  kStandbyFailed,
  kPrimaryRestored, // the primary port is ACTIVE again and its QP re-connected
  kQuiescent,       // nothing outstanding on the standby: safe to switch back
};

// The state after `event`, or nullopt when the event does not apply in `state` (the caller logs
// it at debug level and stays put: e.g. a second port-down while already draining).
std::optional<PathState> next_path_state(PathState state, PathEvent event);

// Whether the application's posts go to the hardware now (false: they are queued in the ring).
bool posts_flow(PathState state);
// Whether the pair is protected (counted in the stats as such).
bool is_protected(PathState state);

std::string_view path_state_name(PathState state);
std::string_view path_event_name(PathEvent event);

}  // namespace vf
