// Shared receive queues (docs/design.md §5i): every protected QP on an SRQ switches with it (its
// receives can be in one place only); a move may wait for members still pairing; an SRQ that
// cannot be protected runs pass-through with all its QPs. Also the SRQ entry points.
#pragma once

#include <cstdint>
#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

// The SRQ group of a QP that takes its receives from a protected SRQ, else nullptr.
SrqGroup* group_of(Engine& e, const VirtualQp& v);

// Switches every QP of an SRQ to `target` and moves the SRQ's unconsumed receives there.
// `passive`: the member whose peer asked for the switch (it answers with the peer's epoch); the
// passives of a move that waited (SrqGroup::pending) are remembered too.
void switch_srq_group(Engine& e, SrqGroup& g, int target, FailoverReason reason,
                      Protection* passive, std::uint32_t passive_epoch,
                      std::uint64_t passive_delivered);

// The shadow of a shared receive queue on the backup device (same depth and SGEs).
bool ensure_shadow_srq(Engine& e, SrqGroup& g, int backup_device);

// A QP the shim cannot protect takes receives from this SRQ: its record would miss what that QP
// consumes, so the SRQ runs pass-through from now on, and so do its QPs.
void pin_srq_group(Engine& e, SrqGroup& g, const std::string& why);

// Entry points (FailoverEngine, engine mutex held): a basic SRQ the application created (its QPs
// are protected with it), resized, destroyed (after the provider destroyed it).
void srq_created(Engine& e, ibv_srq* srq, ibv_pd* pd);
void srq_modified(Engine& e, ibv_srq* srq, ibv_srq_attr* attr, int mask);
void srq_destroyed(Engine& e, ibv_srq* srq);

}  // namespace vf::failover
