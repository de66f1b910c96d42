#include "core/failover/pair_end.h"

#include <string>
#include <utility>

#include "core/failover/message_dispatch.h"
#include "core/failover/path_switch.h"
#include "core/failover/path_wait.h"
#include "core/failover/protection_status.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// Nothing more is asked of the peer or done for the pair: no re-arm, no failback, no pairing.
void stop_pair(Protection& p) {
  p.ended = true;
  p.pairing = false;
  p.start_pairing_pending = false;
  p.rearm[kPrimary] = {};
  p.rearm[kStandby] = {};
}

// A notice: on a session that exists (or to this process), never by connecting while the
// engine's lock is held. A peer that did not get it asks again, and is answered then.
void send_pair_ended(Engine& e, Protection& p) {
  if (!p.paired || p.self_connected) return;
  if (!send_on_open_session(e, p, PairEnded{p.local, p.remote})) {
    VF_LOG_DEBUG("qp {}: no session to the peer's shim; it learns that the pair is over when it "
                 "next asks",
                 p.qp->vqpn);
  }
}

}  // namespace

std::string failed_for_good_reason(Protection& p) {
  VirtualQp& v = *p.qp;
  if (v.failure_shown.exchange(false, std::memory_order_relaxed)) {
    return p.paired ? "no path is left: the application has seen its QP fail, and the QP stays "
                      "failed as it would without the shim"
                    : "the application has seen its QP fail before it was paired";
  }
  const int opcode = v.pass_through_opcode.load(std::memory_order_relaxed);
  if (opcode >= 0) {
    return fmt::format("the application posted {}, which the retransmit ring cannot replay on "
                       "another device (it names a memory window or key of this one, or is not "
                       "modelled): the QP runs pass-through for good on its own QP",
                       wr_opcode_name(static_cast<ibv_wr_opcode>(opcode)));
  }
  // A reason already given (a switch that failed, an SRQ that moved without it) says more.
  if (!p.unprotected_reason.empty()) return p.unprotected_reason;
  if (v.application_failed.load()) {
    return "the application's QP failed, or the application took it down: the pair is over";
  }
  return "the QP runs pass-through for good: the pair is over";
}

void end_pair(Engine& e, Protection& p, std::string reason) {
  if (p.ended) return;
  set_unprotected(p, std::move(reason));
  stop_pair(p);
  send_pair_ended(e, p);
}

void answer_pair_ended(Engine& e, Protection& p) {
  // Its request may come before this end's engine has seen the failure (periodic_work): the
  // pair ends now, with the reason it would have ended with.
  if (!p.ended) return end_pair(e, p, failed_for_good_reason(p));
  send_pair_ended(e, p);
}

void handle_pair_ended(Engine& e, Protection& p) {
  if (p.ended) return;
  // A switch waiting for the peer's answer gets none: it ends now, and the application sees the
  // errors that started it, as it would have without the shim.
  if (p.sw.in_progress) abort_switch(p, "the peer's QP failed for good");
  end_path_wait(e, p, "the peer's QP failed for good while this QP waited for a path");
  set_unprotected(p, "the peer's QP failed for good (its application saw it fail or took it "
                     "down) or runs pass-through for good; this QP stays on the path it uses, "
                     "as it would without the shim");
  stop_pair(p);
}

}  // namespace vf::failover
