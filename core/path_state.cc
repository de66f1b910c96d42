#include "core/path_state.h"

namespace vf {

std::optional<PathState> next_path_state(PathState state, PathEvent event) {
  using S = PathState;
  using E = PathEvent;
  switch (state) {
    case S::kUnpaired:
      if (event == E::kPairingStarted) return S::kPairing;
      if (event == E::kPairingFailed) return S::kUnprotected;
      break;
    case S::kPairing:
      if (event == E::kPairingDone) return S::kPrimary;
      if (event == E::kPairingFailed) return S::kUnprotected;
      break;
    case S::kPrimary:
      if (event == E::kPrimaryFailed) return S::kDraining;
      // The standby dying while idle costs nothing now, but the pair is no longer protected.
      if (event == E::kStandbyFailed) return S::kUnprotected;
      break;
    case S::kDraining:
      if (event == E::kDrained) return S::kHandshake;
      if (event == E::kStandbyFailed) return S::kDead;
      break;
    case S::kHandshake:
      if (event == E::kPeerCounts) return S::kStandby;
      if (event == E::kStandbyFailed) return S::kDead;
      break;
    case S::kStandby:
      if (event == E::kPrimaryRestored) return S::kFailingBack;
      if (event == E::kStandbyFailed) return S::kDead;
      break;
    case S::kFailingBack:
      if (event == E::kQuiescent) return S::kPrimary;
      // Switching back needs no replay, so a standby failure here is a plain failover again.
      if (event == E::kStandbyFailed) return S::kDraining;
      if (event == E::kPrimaryFailed) return S::kStandby;  // the flap ended: stay on standby
      break;
    case S::kUnprotected:
    case S::kDead:
      break;
  }
  return std::nullopt;
}

bool posts_flow(PathState state) {
  return state != PathState::kDraining && state != PathState::kHandshake;
}

bool is_protected(PathState state) {
  switch (state) {
    case PathState::kPrimary:
    case PathState::kDraining:
    case PathState::kHandshake:
    case PathState::kStandby:
    case PathState::kFailingBack:
      return true;
    default:
      return false;
  }
}

std::string_view path_state_name(PathState state) {
  switch (state) {
    case PathState::kUnpaired: return "unpaired";
    case PathState::kPairing: return "pairing";
    case PathState::kPrimary: return "primary";
    case PathState::kDraining: return "draining";
    case PathState::kHandshake: return "handshake";
    case PathState::kStandby: return "standby";
    case PathState::kFailingBack: return "failing-back";
    case PathState::kUnprotected: return "unprotected";
    case PathState::kDead: return "dead";
  }
  return "?";
}

std::string_view path_event_name(PathEvent event) {
  switch (event) {
    case PathEvent::kPairingStarted: return "pairing-started";
    case PathEvent::kPairingDone: return "pairing-done";
    case PathEvent::kPairingFailed: return "pairing-failed";
    case PathEvent::kPrimaryFailed: return "primary-failed";
    case PathEvent::kDrained: return "drained";
    case PathEvent::kPeerCounts: return "peer-counts";
    case PathEvent::kStandbyFailed: return "standby-failed";
    case PathEvent::kPrimaryRestored: return "primary-restored";
    case PathEvent::kQuiescent: return "quiescent";
  }
  return "?";
}

}  // namespace vf
