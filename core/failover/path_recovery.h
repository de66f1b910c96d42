// Re-arm, failback and hold-down: a path that failed is re-connected when its port is ACTIVE
// again (one end asks, the other answers: Rearm), the traffic moves back to the primary
// (failback), a path that failed silently is held down first, and each end tells the other when
// an idle path's port goes or comes back (PathStatus).
#pragma once

#include <cstdint>

#include "core/failover/engine_state.h"

namespace vf::failover {

// The active path failed with error completions (seen here, or by the peer, which asks for the
// switch): if its port is ACTIVE nothing local explains it, and it is held down before its re-arm
// (HoldDown).
bool hold_down_if_silent(Engine& e, Protection& p, int path, std::uint64_t now, bool seen_by_peer);

// The peer asks to re-connect a path (it resets and connects ours, answers, and the path is
// restored), or answers our request (we connect ours; a restored primary starts the failback).
void handle_rearm(Engine& e, const vf::Rearm& message);

// A path that needs re-arming, whose port is ACTIVE and that is not held down: the asker asks
// (Rearm, again after Engine::rearm_retry_ns), the answerer says its port is back (PathStatus).
// One end asks and the other answers, never both (answers_rearm in path_recovery.cc).
void maybe_rearm(Engine& e, Protection& p, int path);

// A failback put off for an atomic in flight (Protection::failback_deferred) starts once none is;
// dropped when the failback no longer applies. Each pass of the engine.
void try_deferred_failback(Engine& e, Protection& p);

// A notice, not a step of a protocol that waits for it: sent only on a session that exists (or
// to this process), never by connecting while the engine's lock is held. A lost "up" is sent
// again by maybe_rearm; a lost "down" costs the peer's report, not its data.
void send_path_status(Engine& e, Protection& p, int path, bool up);

// The peer's end of one of our idle paths lost its port, or has it again (PathStatus).
void handle_path_status(Engine& e, const PathStatus& message);

}  // namespace vf::failover
