// The end of a pair (docs/design.md §5g "Failed for good"): once one end's QP has failed for good
// (its application has seen it fail, or took it down), neither end may switch, re-arm or fail
// back, and the other end must not wait for answers that will never come. The end whose QP failed
// says so (PairEnded) when it happens and again in answer to any later request about that QP;
// the other end then ends any switch at once (its application sees what it would have seen
// without the shim) and stays on the path it is on, unprotected.
#pragma once

#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Why this end's QP is failed for good: no path left and its error shown (VirtualQp::failure_shown,
// which this takes), the application's own error or ERR, or pass-through for good.
std::string failed_for_good_reason(Protection& p);

// This end's QP is failed for good: the pair ends here (or the pairing, if it was not done),
// with `reason` as the QP's unprotected reason, and the peer is told.
void end_pair(Engine& e, Protection& p, std::string reason);

// The peer asked something about a QP that is failed for good here: it missed our PairEnded (or
// asked before it arrived), so it is told again. Also ends the pair here if nothing had yet.
void answer_pair_ended(Engine& e, Protection& p);

// The peer's QP of this pair failed for good (PairEnded, from the pair's own peer).
void handle_pair_ended(Engine& e, Protection& p);

}  // namespace vf::failover
