// Probes of the idle standby (issue 20 item 1; docs/design.md §5d "Probes of the idle
// standby"). A standby that only idles says nothing about its data path: a black hole beyond its
// port (a dead optic that keeps the link up, a switch port dropping frames) leaves it "protected"
// until the failover that needs it fails. So while the primary carries the traffic the engine
// posts, every Engine::probe_interval_ns (VERBS_FAILOVER_PROBE_MS), one zero-length RDMA WRITE
// on each paired QP's standby: it touches no memory, needs no rkey (C9-88), consumes no receive
// and completes on the standby's CQ, the CQ's shadow, where the data path hides it
// (is_probe_wr_id). A probe that fails with a link-class error, or is not answered in twice its
// retries' time (at least kProbeAnswerTimeoutNs), fails the standby as a silent failure: held
// down, reported unprotected, the peer told (PathStatus), re-armed after the hold, and probed
// again.
#pragma once

#include <cstdint>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Each engine pass: posts a due probe on `p`'s idle standby, or looks for the answer of the one
// in flight (polling the standby's CQ shadow when no application thread does), and acts on a
// failure. Forgets the probe when the standby stops idling (a switch, a re-arm): its late
// completion is then ignored.
void probe_idle_standby(Engine& e, Protection& p, std::uint64_t now, bool round_due);

// Once per engine pass, before probe_idle_standby: whether a round of probes is due now (every
// QP whose standby idles and has no probe in flight gets one); the next round is then scheduled.
// One round for all QPs, so that the engine wakes once per period, not once per QP.
bool probe_round_due(Engine& e, std::uint64_t now);

// Whether a probe of `p` waits for its answer (the engine then passes every 20 ms).
bool probe_in_flight(const Protection& p);

// When the next round of probes is due (0: probes are off): the engine's wait ends then.
std::uint64_t next_probe_due_ns(const Engine& e);

}  // namespace vf::failover
