// Moving QPs between states: the application's QP (with libibverbs' cached qp->state kept as the
// application set it) and the engine's own, connecting a standby pair or re-connecting a primary
// with the application's attributes, its ECE and fresh PSNs. No decision is taken here: the
// rooms that call these decide when.
#pragma once

#include <cstdint>

#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

inline constexpr unsigned int kFullAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// ibv_modify_qp by the engine. For the application's QP (app_qp): libibverbs caches the state in
// qp->state and some providers read that cache as the current state, but the application must
// keep reading the state it set; so around the engine's own transitions the cache holds the
// physical state (Engine::physical_states), then the application's again. 0 or the errno.
int modify(Engine& e, ibv_qp* qp, ibv_qp_attr* attr, int mask, bool app_qp);

// Which step of re-arming a path the provider refused, and its errno, for the line that reports
// the failure (a re-arm that fails over and over must say why: a GID or route gone after a flap
// reads differently from attributes the provider rejects).
struct StepFailure {
  std::string step;  // "RESET", "INIT", "RTR to the peer's qp N (...)", "RTS", ...
  int error = 0;     // the provider's errno; 0 when no provider call failed
  std::string text() const;
};

// A path's own GID where the port's table has it now (the same value and type), kept in
// PhysicalPath::gid_index. Its index can change under a running job: the kernel numbers RoCE GIDs
// by slot, and an address removed and added again (a flap handled by a network manager, an
// operator's repair) takes the first free slot, while the index the path was connected with holds
// another address or nothing (issue 20 item 4). Re-connecting with the old index fails (ENODATA)
// or, worse, sends from the wrong address. False, with the reason, while the GID is gone; true
// and nothing changed when the GID is not known (zero).
bool refresh_gid_index(Engine& e, Protection& p, int path, StepFailure& failure);

bool to_reset_and_init(Engine& e, ibv_qp* qp, std::uint8_t port, unsigned int access, bool app_qp,
                       StepFailure* failure = nullptr);
bool to_error(Engine& e, ibv_qp* qp, bool app_qp);

// RTR then RTS for one of the engine's own QPs (RoCE/IB with a GRH).
struct EngineQpLink {
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint32_t dest_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  Gid dest_gid{};
  int sgid_index = 0;
  std::uint8_t port = 1;
  std::uint8_t rd_atomic = 1;
  std::uint8_t timeout = 14;
  std::uint8_t retry_cnt = kMaxRetryCount;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 1;
};
// 0 or the provider's errno; *step names the state that failed.
int connect_engine_qp(Engine& e, ibv_qp* qp, const EngineQpLink& link, const char** step);
// Its two steps, for a standby that waits in RTR (connect_standby). 0 or the provider's errno.
int engine_qp_to_rtr(Engine& e, ibv_qp* qp, const EngineQpLink& link);
int engine_qp_to_rts(Engine& e, ibv_qp* qp, const EngineQpLink& link);

// The MTU this side offers for the standby pair: the backup port's, no larger than what the
// application gave its primary.
ibv_mtu standby_mtu(Engine& e, const Protection& p);

// The application's ECE on its primary QP, read once; vendor 0 when the provider has none (rxe,
// or a libibverbs older than ECE).
const ibv_ece& primary_ece(Engine& e, Protection& p);

// What the standby pair runs with: the options both primaries have. Each end computes it from
// the same two values (its own primary's and the peer's, from the pairing message), so both
// standbys agree without another round trip. None when either end has no ECE or the vendors
// differ (the options of one vendor mean nothing to another).
ibv_ece agree_ece(const ibv_ece& mine, const PairRequest& theirs);

// Connects the standby QP to the peer's standby (RTR then RTS). False (logged) if it fails.
// The standby answers RNR and retries RNR as the application's QP does (its min_rnr_timer and
// rnr_retry): an application that relies on RNR_RETRY_EXC_ERR must get it after a failover too,
// not retries without end. Pairing starts at the application's RTR, before its RTS says how
// many RNR retries it wants, and a QP in RTS cannot change that count (RTR -> RTS sets it); so
// until the application's RTS the standby stays in RTR (it receives, and there is nothing to
// send before RTS) with Protection::standby_rts_pending set, and standby_follow_rts completes it.
bool connect_standby(Engine& e, Protection& p, std::uint32_t dest_qpn, const Gid& dest_gid,
                     std::uint32_t dest_psn, std::uint8_t peer_mtu);

// The application's QP went to RTS (asked = what it gave), or was tuned in RTS: a standby left in
// RTR moves to RTS with its retry counts; a min_rnr_timer changed in RTS is changed on the
// standby too. 0, or the provider's errno (logged) if the standby refused.
int standby_follow_rts(Engine& e, Protection& p, const ibv_qp_attr& asked, int mask);

// Back to INIT on its port, ready to be connected again: the application's QP with the access
// flags the application gave it, the standby with all of them.
bool reset_path(Engine& e, Protection& p, int path, StepFailure* failure = nullptr);
// Connects a path that reset_path prepared to the peer's QP of that path: the primary with the
// application's attributes, the standby as at pairing.
bool connect_path(Engine& e, Protection& p, int path, std::uint32_t qpn, const Gid& gid,
                  std::uint32_t psn, StepFailure* failure = nullptr);

// A fresh 24-bit PSN for a path that is connected again.
std::uint32_t random_psn();

}  // namespace vf::failover
