// The stats file (core/stats.h renders it): every port, every QP the engine saw (protected or
// not, and why), each switch with its times; and the protection status tests ask for.
#pragma once

#include <cstdint>
#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Writes VERBS_FAILOVER_STATS (if set). Takes the engine mutex itself for the snapshot; the file
// is written without it. Writes from several threads are ordered (Engine::stats_file_mutex), and
// once the exit handler's ("exit") is written, later ones are not: the file ends as the process
// ended.
void write_stats(Engine& e, const char* reason);

// Engine mutex held: whether what the stats file says has changed since it was last written
// (a pairing, a switch begun or done, a resume, a port's state...). Cheap: a few integers per
// QP, so that the engine's thread can ask on every pass.
bool stats_changed(const Engine& e);

// Entry point (FailoverEngine, engine mutex held): what the stats file would say of the QP whose
// application QPN is qpn: 1 protected, 0 not (reason says why), -1 the engine does not know it.
int protection_of(Engine& e, std::uint32_t qpn, std::string& reason);
// Entry point (FailoverEngine, engine mutex held): the path the QP whose application QPN is qpn
// uses (0 primary, 1 standby, 2 switching; -1 the engine does not protect it), and its switches.
int switches_of(Engine& e, std::uint32_t qpn, std::uint64_t* failovers, std::uint64_t* failbacks);

}  // namespace vf::failover
