// Pairing: a QP that reached RTR finds its peer's shim (same process, or over the control
// channel: the candidates are the peer GID's address and VERBS_FAILOVER_CTRL_ADDRS over the port
// range) and the two standbys are connected to each other; the peer learns our registrations.
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// The peer's shim describes its standby for one of our QPs (PairRequest): ours is connected to
// it and described back (PairReply), or the request is refused (PairRefused: unknown QP, or no
// standby here).
void handle_pair_request(Engine& e, const PeerRef& from, std::uint64_t session,
                         const PairRequest& request);
// The answer to our request: the standby pair is connected.
void handle_pair_reply(Engine& e, const PeerRef& from, std::uint64_t session,
                       const PairReply& reply);
// Refused: the next candidate address is tried, or (no standby there) the QP runs unprotected.
void handle_pair_refused(Engine& e, const PairRefused& refused);

// Local pairing: both QPs are in this process (loopback, or NCCL's self-connected flush QP).
// False when the peer QP is not in this process.
bool pair_locally(Engine& e, Protection& p);

// A QP at RTR whose peer is in another process: the candidates (the peer GID's IPv4 address and
// VERBS_FAILOVER_CTRL_ADDRS, over the control port range) are tried in turn.
void start_pairing(Engine& e, Protection& p);
// The next candidate (the previous one refused, closed or did not answer in time); after the
// last, another round later (up to kPairingRounds), then the QP runs unprotected.
void try_next_candidate(Engine& e, Protection& p);

}  // namespace vf::failover
