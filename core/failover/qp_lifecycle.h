// The application's QP from creation to destruction: its standby QP created beside it on the
// backup device, its modifies followed (INIT; RTR starts pairing; RTS; ERR/RESET are the
// application's own), its state as queried, its destruction (its stats are kept).
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Entry points (FailoverEngine, engine mutex held). After ibv_create_qp(_ex): a protected RC QP
// gets its VirtualQp and standby, any other QP is recorded as unprotected with the reason.
void qp_created(Engine& e, ibv_qp* qp, const ibv_qp_init_attr_ex& attr);
// The whole ibv_modify_qp of a protected QP (v): adjusts what the primary needs (a shorter
// transport timeout, at most kMaxRetryCount retries), calls `real`, and follows the QP's life.
int modify_app_qp(Engine& e, VirtualQp* v, ibv_qp* qp, ibv_qp_attr* attr, int mask,
                  int (*real)(ibv_qp*, ibv_qp_attr*, int));
// Before the provider destroys the QP: the standby goes, the record stays for the stats.
void qp_destroying(Engine& e, ibv_qp* qp);

// After a successful ibv_query_qp (libibverbs has written the provider's state into qp->state):
// a protected QP the application has not taken down reads the state it set (application_view,
// qp->state before the query), in qp->state and attr, whatever its physical state (INIT or ERR
// while its traffic runs on the standby). Lock-free.
void qp_queried(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_state application_view);

}  // namespace vf::failover
