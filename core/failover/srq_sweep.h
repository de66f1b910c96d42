// Empties an SRQ of the receives that moved away from it, with a loopback pair of the engine's QPs
// (an SRQ is never flushed, and a receive left there would be handed out a second time).
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Empties a path's SRQ of the receives that moved away from it (an SRQ is never flushed, and a
// receive left there would be handed out a second time): a loopback pair of the engine's QPs,
// one attached to that SRQ, sends zero-length messages into it until the responder has no
// receive left (an RNR with no retry). Zero-length messages write nothing into the buffers.
bool sweep_srq(Engine& e, SrqGroup& g, int path);

}  // namespace vf::failover
