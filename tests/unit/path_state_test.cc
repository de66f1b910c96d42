#include <catch2/catch.hpp>

#include <initializer_list>
#include <set>

#include "core/path_state.h"

using vf::PathEvent;
using vf::PathState;

namespace {
PathState run(PathState state, std::initializer_list<PathEvent> events) {
  for (PathEvent event : events) {
    const auto next = vf::next_path_state(state, event);
    REQUIRE(next.has_value());
    state = *next;
  }
  return state;
}

constexpr PathState kAllStates[] = {
    PathState::kUnpaired,  PathState::kPairing,     PathState::kPrimary,
    PathState::kDraining,  PathState::kHandshake,   PathState::kStandby,
    PathState::kFailingBack, PathState::kUnprotected, PathState::kDead};
constexpr PathEvent kAllEvents[] = {
    PathEvent::kPairingStarted, PathEvent::kPairingDone,    PathEvent::kPairingFailed,
    PathEvent::kPrimaryFailed,  PathEvent::kDrained,        PathEvent::kPeerCounts,
    PathEvent::kStandbyFailed,  PathEvent::kPrimaryRestored, PathEvent::kQuiescent};
}  // namespace

TEST_CASE("a full cycle: pairing, failover, failback") {
  PathState state = run(PathState::kUnpaired, {PathEvent::kPairingStarted, PathEvent::kPairingDone});
  CHECK(state == PathState::kPrimary);
  state = run(state, {PathEvent::kPrimaryFailed});
  CHECK(state == PathState::kDraining);
  CHECK_FALSE(vf::posts_flow(state));  // posts wait in the ring while the primary drains
  state = run(state, {PathEvent::kDrained, PathEvent::kPeerCounts});
  CHECK(state == PathState::kStandby);
  CHECK(vf::posts_flow(state));
  state = run(state, {PathEvent::kPrimaryRestored, PathEvent::kQuiescent});
  CHECK(state == PathState::kPrimary);
}

TEST_CASE("no backup or no peer shim: unprotected for good, never an error") {
  CHECK(run(PathState::kUnpaired, {PathEvent::kPairingFailed}) == PathState::kUnprotected);
  CHECK(run(PathState::kUnpaired, {PathEvent::kPairingStarted, PathEvent::kPairingFailed}) ==
        PathState::kUnprotected);
  for (PathEvent event : kAllEvents) {
    CHECK_FALSE(vf::next_path_state(PathState::kUnprotected, event).has_value());
  }
  CHECK(vf::posts_flow(PathState::kUnprotected));
  CHECK_FALSE(vf::is_protected(PathState::kUnprotected));
}

TEST_CASE("both paths lost during or after a failover: dead, the application sees the error") {
  CHECK(run(PathState::kPrimary, {PathEvent::kPrimaryFailed, PathEvent::kStandbyFailed}) ==
        PathState::kDead);
  CHECK(run(PathState::kStandby, {PathEvent::kStandbyFailed}) == PathState::kDead);
  CHECK(vf::posts_flow(PathState::kDead));  // posts reach the hardware and fail as they would
}

TEST_CASE("a flap during failback keeps traffic on the standby, a standby loss then fails over") {
  CHECK(run(PathState::kFailingBack, {PathEvent::kPrimaryFailed}) == PathState::kStandby);
  CHECK(run(PathState::kFailingBack, {PathEvent::kStandbyFailed}) == PathState::kDraining);
}

TEST_CASE("repeated or late events do not move the state") {
  CHECK_FALSE(vf::next_path_state(PathState::kDraining, PathEvent::kPrimaryFailed).has_value());
  CHECK_FALSE(vf::next_path_state(PathState::kStandby, PathEvent::kPrimaryFailed).has_value());
  CHECK_FALSE(vf::next_path_state(PathState::kPrimary, PathEvent::kPeerCounts).has_value());
  CHECK_FALSE(vf::next_path_state(PathState::kPrimary, PathEvent::kQuiescent).has_value());
}

TEST_CASE("every state is reachable from unpaired and every state and event has a name") {
  std::set<PathState> reached{PathState::kUnpaired};
  for (bool grew = true; grew;) {
    grew = false;
    for (PathState state : std::set<PathState>(reached)) {
      for (PathEvent event : kAllEvents) {
        if (auto next = vf::next_path_state(state, event)) grew |= reached.insert(*next).second;
      }
    }
  }
  CHECK(reached.size() == std::size(kAllStates));
  for (PathState state : kAllStates) CHECK(vf::path_state_name(state) != "?");
  for (PathEvent event : kAllEvents) CHECK(vf::path_event_name(event) != "?");
}
