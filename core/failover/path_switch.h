// The switch (docs/design.md §5d): begin (stop the old path, drain, count what it delivered, move
// the receives), the exchange of delivered counts with the peer (FailoverRequest/Reply), finish
// (replay exactly what the peer did not get, complete what it proved done), and abort when no
// switch can happen (the application then sees what it would have seen without the shim).
#pragma once

#include <cstdint>
#include <vector>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Moves a QP's traffic to `target` (a port down, a link error, a failback): begins this side's
// half and asks the peer (FailoverRequest); an SRQ's QPs move together (srq_group.h). A QP that
// cannot move gets its held errors and runs pass-through.
void start_switch(Engine& e, Protection& p, int target, FailoverReason reason);

// This side's half: stop the old path (ERR), drain it (path_drain.h), count what it delivered,
// move the receives to `target`; posts wait until finish_switch. False, with nothing done, when
// the application made the QP pass-through since the caller's can_switch_to (VirtualQp::
// claim_for_switch).
bool begin_switch(Engine& e, Protection& p, int target, FailoverReason reason, std::uint32_t epoch,
                  bool initiator);

// Both counts known: completes what the peer proved done, replays exactly the rest on the new
// path, resumes posting, and resets the old path for a later re-arm.
void finish_switch(Engine& e, Protection& p);

// Whether the QP can move its traffic to `target` now (paired, connected, not failed).
bool can_switch_to(const Protection& p, int target);

// No switch will happen: the error completions hidden for one reach the application, and the
// QP runs pass-through from here (the application gets the error it would have got).
void release_held_errors(Protection& p);

// A switch whose peer never answers (its process is gone, the control channel is cut both ways):
// the application gets what it would have got without the shim — the old path's error
// completions (held), and a flush error for every signaled request it posted during the switch
// that reached no QP.
void abort_switch(Protection& p, const char* why);

// Requests recorded but never posted (a switch held them, or a key's translation is missing)
// reached no QP: a flush completion for each, as a QP in ERR would have completed it, in order.
// Under the QP's lock.
std::vector<ibv_wc> unposted_request_flushes_locked(const VirtualQp& v);

// The initiator's half begun (begin_switch): the peer is asked to switch too, with our count
// (FailoverRequest); a peer that cannot be reached aborts the switch.
void ask_peer_to_switch(Engine& e, Protection& p, FailoverReason reason);

// The initiator's request unanswered for kSwitchResendNs: sent again, same epoch and count (each
// engine pass; periodic_work aborts the switch at kSwitchAnswerTimeoutNs).
void resend_switch_request(Engine& e, Protection& p, std::uint64_t now);

// FailoverRequest (is_request) or FailoverReply for our QP `ours`: the answer to our switch
// (finish it), or the peer's switch (begin ours, answer_failover). Stale epochs are ignored.
void handle_failover(Engine& e, const QpKey& ours, std::uint64_t delivered, std::uint32_t epoch,
                     std::uint8_t target, bool is_request, FailoverReason reason);

// The passive side, its half begun: the peer's count is known, ours goes back, replay.
void answer_failover(Engine& e, Protection& p, std::uint64_t delivered);

}  // namespace vf::failover
