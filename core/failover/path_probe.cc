#include "core/failover/path_probe.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/failover/path_recovery.h"
#include "core/failover/protection_status.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// The standby carries nothing and is ready to: connected in RTS, not failed, not being re-armed,
// no switch or wait that could take it. Anything else is the switch's or the re-arm's business,
// and a probe in flight is forgotten (its completion, if it comes, no longer matches).
bool standby_idles(const Engine& e, const Protection& p) {
  const VirtualQp& v = *p.qp;
  return e.probe_interval_ns != 0 && !p.probe.disabled && p.paired && !p.ended && !p.destroyed &&
         !p.sw.in_progress && !p.path_wait.active && !p.failback_deferred &&
         !p.standby_rts_pending && v.active_path() == kPrimary && v.path[kStandby].qp != nullptr &&
         v.send_cq->shadow != nullptr && v.path[kStandby].connected.load() &&
         !v.path[kStandby].failed.load() && !p.rearm[kStandby].needed && !v.standby_lost() &&
         !v.application_failed.load();
}

// How long a probe may go without a completion before it counts as failed: its transport retries
// (7 tries of 4.096 us * 2^timeout, the standby's timeout being at most VERBS_FAILOVER_QP_TIMEOUT)
// twice over, and never under kProbeAnswerTimeoutNs; so a long configured timeout is not cut
// short, and one probe lost on a sound path is retried by the transport first.
std::uint64_t answer_timeout_ns(const Engine& e) {
  const double retries_ns = 7.0 * 4096.0 * static_cast<double>(1ull << e.config.qp_timeout);
  return std::max(kProbeAnswerTimeoutNs, static_cast<std::uint64_t>(2.0 * retries_ns));
}

void post_probe(Engine& e, Protection& p, std::uint64_t now) {
  VirtualQp& v = *p.qp;
  ibv_qp* qp = v.path[kStandby].qp;
  // Zero bytes: no SGE, and no rkey or address is looked at by the responder (IBTA C9-88); the
  // peer's standby accepts remote writes (it is created with full access).
  ibv_send_wr wr{};
  // Numbered across the process: a stale completion of a destroyed standby whose QP number came
  // back cannot match another QP's probe.
  wr.wr_id = kProbeTag | (++e.probe_serial & (kProbeTag - 1));
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  const int result = e.verbs.provider_ops(qp->context)->post_send(qp, &wr, &bad);
  if (result != 0) {
    // Its send queue is full or the QP is not in RTS: the next round tries again.
    VF_LOG_DEBUG("qp {}: no probe on the standby path ({})", v.vqpn, strerror(result));
    return;
  }
  p.probe.in_flight = wr.wr_id;
  p.probe.posted_ns = now;
  ++p.probe.sent;
}

// The standby failed (`silent`: a link-class error or no answer) or refused the probe (another
// error: its QP is in ERR all the same). Either way it cannot carry anything now: it is marked
// failed, the peer told, and re-armed; a silent failure is held down first, as on the active
// path (path_recovery.h), so that a dead path is not re-armed and failed again at once.
void standby_probe_failed(Engine& e, Protection& p, const std::string& what, bool silent,
                          std::uint64_t now) {
  VirtualQp& v = *p.qp;
  ++p.probe.failures;
  p.probe.in_flight = 0;
  v.path[kStandby].failed = true;
  RearmState& rearm = p.rearm[kStandby];
  rearm.awaiting = false;
  rearm.needed = true;
  rearm.notice_sent_ns = 0;
  if (silent) {
    VF_LOG_WARN("qp {}: its standby path failed a probe ({}); the primary path carries on alone",
                v.vqpn, what);
  } else {
    // Not a failure of the path (it answered): a device or peer that does not take zero-length
    // writes. Probing it would fail its standby every round.
    p.probe.disabled = true;
    VF_LOG_WARN(
        "qp {}: its standby path refused a probe ({}); this QP's standby is not probed "
        "any more, and is re-armed",
        v.vqpn, what);
  }
  if (!silent || !hold_down_if_silent(e, p, kStandby, now, false)) {
    set_unprotected(p, fmt::format("its standby path failed a probe ({}); running on the primary "
                                   "path alone",
                                   what));
  }
  send_path_status(e, p, kStandby, false);
}

}  // namespace

bool probe_in_flight(const Protection& p) {
  // An answer the application's poll of an active shadow will bring is not waited for (below).
  return p.probe.in_flight != 0 && !p.qp->send_cq->shadow_active.load();
}

std::uint64_t next_probe_due_ns(const Engine& e) {
  // The first round is due at once (next_probe_round_ns 0), which must not read as "none": an
  // engine with nothing else to do would then sleep for good and never probe.
  return e.probe_interval_ns == 0 ? 0 : std::max<std::uint64_t>(e.next_probe_round_ns, 1);
}

bool probe_round_due(Engine& e, std::uint64_t now) {
  if (e.probe_interval_ns == 0 || now < e.next_probe_round_ns) return false;
  e.next_probe_round_ns = now + e.probe_interval_ns;
  return true;
}

void probe_idle_standby(Engine& e, Protection& p, std::uint64_t now, bool round_due) {
  if (!standby_idles(e, p)) {
    p.probe.in_flight = 0;
    return;
  }
  VirtualQp& v = *p.qp;
  if (p.probe.in_flight == 0) {
    if (round_due && now >= p.probe.quiet_until_ns) post_probe(e, p, now);
    return;
  }
  // Its completion is in the standby's send CQ shadow. No application thread polls it while every
  // QP of the CQ runs on its primary: the engine does, without the CQ's lock. Once another QP of
  // the CQ runs on its standby, the application's poll takes it; an application that does not
  // poll then leaves the probe unanswered, which proves nothing (no timeout, no new probe that
  // would fill the shadow).
  const bool engine_polls = !v.send_cq->shadow_active.load();
  if (engine_polls) v.send_cq->poll_idle_shadow();
  const bool answered = v.probe_answer_wr_id() == p.probe.in_flight;
  const ibv_wc_status status = v.probe_answer_status();
  if (answered && status == IBV_WC_SUCCESS) {
    p.probe.in_flight = 0;
    return;
  }
  if (answered) {
    standby_probe_failed(
        e, p,
        fmt::format("completion status {} ({})", wc_status_name(status), static_cast<int>(status)),
        is_link_failure(status), now);
    return;
  }
  if (const std::uint64_t limit = answer_timeout_ns(e);
      engine_polls && now - p.probe.posted_ns > limit) {
    standby_probe_failed(e, p,
                         fmt::format("no completion in {:.1f} s", static_cast<double>(limit) / 1e9),
                         true, now);
  }
}

}  // namespace vf::failover
