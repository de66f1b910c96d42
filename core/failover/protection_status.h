// A QP's protection as the stats and logs report it (protected, or unprotected and why), and the
// lookup of a protected QP by the key a peer names it with.
#pragma once

#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

// The standby pair is connected: the QP is protected (logged).
void mark_protected(Engine& e, Protection& p);

// The QP runs without a usable second path; the reason is logged once and reported in the stats.
void set_unprotected(Protection& p, std::string reason);

// The protected QP a peer names by (QPN, GID). A QP the application has not moved to RTR yet
// (its GID index is not known) is found by its QPN and any GID of its port: a peer that reached
// RTR first must not be refused.
Protection* protection_by_key(Engine& e, const QpKey& key);

}  // namespace vf::failover
