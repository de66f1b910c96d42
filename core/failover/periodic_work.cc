#include "core/failover/periodic_work.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/message_dispatch.h"
#include "core/failover/pair_end.h"
#include "core/failover/pairing.h"
#include "core/failover/path_probe.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_switch.h"
#include "core/failover/path_wait.h"
#include "core/failover/protection_status.h"
#include "core/failover/srq_group.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// A switch whose new path has reported nothing for kResumeLateNs while work was outstanding:
// what both ends of the path look like, once. Not an error by itself (the peer may simply have
// nothing to send), but a request the new path never completes waits silently when its device
// retries for ever (rnr_retry 7; rxe also takes retry_cnt 7 as "for ever"), and the two ends'
// lines side by side tell a receive missing at the responder (RNR) from a PSN the ends disagree
// on.
void report_late_resume(Engine& e, Protection& p) {
  VirtualQp& v = *p.qp;
  const int active = v.active_path();
  ibv_qp* qp = v.path[active].qp;
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  std::string physical = "not queried";
  // libibverbs copies the queried state into qp->state; the active path's QP may be the
  // application's own, whose qp->state must keep the application's view (§5e).
  const ibv_qp_state application_view = qp != nullptr ? qp->state : IBV_QPS_RESET;
  const bool queried =
      qp != nullptr && e.verbs.query_qp != nullptr &&
      e.verbs.query_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN | IBV_QP_DEST_QPN,
                       &init) == 0;
  if (qp != nullptr) qp->state = application_view;
  if (queried) {
    physical =
        fmt::format("state {}, sq_psn {:#x}, rq_psn {:#x}, dest qp {}",
                    qp_state_name(attr.qp_state), attr.sq_psn, attr.rq_psn, attr.dest_qp_num);
  }
  v.lock().lock();
  const std::uint32_t sends = v.send_ring().outstanding();
  const std::uint64_t next_sequence = v.send_ring().next_sequence();
  const std::uint64_t next_to_post = v.next_send_to_post();
  const std::uint64_t messages = v.send_ring().messages_posted();
  const std::uint32_t receives = v.recv_ring().pending();
  const std::uint64_t delivered = v.recv_ring().delivered_messages();
  v.lock().unlock();
  VF_LOG_INFO(
      "qp {}: no completion on the {} path {:.1f} s after the switch: {} request(s) "
      "outstanding (next to post {}, next sequence {}, {} message(s) posted), {} "
      "receive(s) pending ({} message(s) delivered); {} qp {}: {}",
      v.vqpn, path_name(active),
      static_cast<double>(monotonic_ns() - p.switched_monotonic_ns) / 1e9, sends, next_to_post,
      next_sequence, messages, receives, delivered, path_name(active),
      qp != nullptr ? qp->qp_num : 0, physical);
}

}  // namespace

void periodic_work(Engine& e) {
  const std::uint64_t now = monotonic_ns();
  const bool probe_round = probe_round_due(e, now);
  for (auto& [app_srq, g] : e.srqs) {
    if (g.pending.active) switch_srq_group(e, g, g.pending.target, g.pending.reason, nullptr, 0, 0);
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    VirtualQp& v = *p.qp;
    if (v.failure_shown.load(std::memory_order_relaxed)) {
      // No path was left and the application has seen the error (issue 19 item 1): failed for
      // good, no re-arm, no failback, and the peer is told; a pairing still under way stops. A
      // QP that never paired and no longer tries keeps its reason.
      if (p.paired || p.pairing || p.start_pairing_pending) {
        end_pair(e, p, failed_for_good_reason(p));
      } else {
        v.failure_shown.store(false, std::memory_order_relaxed);
        p.ended = true;
      }
    }
    if (v.pass_through_opcode.load(std::memory_order_relaxed) >= 0 && !p.ended) {
      // A request the ring cannot replay made it pass-through (issue 19 item 8): the pair ends,
      // and the peer is told, so that neither end switches to a path this QP cannot follow.
      end_pair(e, p, failed_for_good_reason(p));
    }
    v.errors_wait_for_path.store(p.path_wait.active || may_wait_for_path(e, p, kStandby) ||
                                     may_wait_for_path(e, p, kPrimary),
                                 std::memory_order_relaxed);
    if (p.path_wait.active) {
      // Errors of the dead path while the QP waits for the other one: held with the first (no
      // new hold-down, no new switch; path_wait.h decides).
      v.link_error_seen.store(false, std::memory_order_relaxed);
    }
    if (v.link_error_seen.load(std::memory_order_relaxed) && !p.sw.in_progress) {
      // The peer is told "error completion" only for a silent failure (it then holds the path
      // down too); errors of a port that is down are that port's failure.
      const bool silent = hold_down_if_silent(e, p, v.active_path(), now, false);
      v.path[v.active_path()].failed = true;
      start_switch(e, p, other_path(v.active_path()),
                   silent ? FailoverReason::kErrorCompletion : FailoverReason::kPortDown);
      v.link_error_seen.store(false);
    }
    if (p.start_pairing_pending) {
      p.start_pairing_pending = false;
      if (!p.paired && !p.pairing) start_pairing(e, p);
    }
    resend_switch_request(e, p, now);
    if (p.sw.in_progress && !p.sw.peer_known && now > p.sw.started_monotonic_ns &&
        now - p.sw.started_monotonic_ns > kSwitchAnswerTimeoutNs) {
      abort_switch(p, "no answer from the peer's shim within 10 s");
    }
    if (p.pairing && p.awaiting_session != 0 && now > p.awaiting_since_ns &&
        now - p.awaiting_since_ns > kPairingAnswerTimeoutNs) {
      p.awaiting_session = 0;
      try_next_candidate(e, p);
    }
    if (p.pairing && p.awaiting_session == 0 && p.retry_at_ns != 0 && now >= p.retry_at_ns) {
      p.retry_at_ns = 0;
      try_next_candidate(e, p);
    }
    if (v.translation_missing.exchange(false)) {
      // Ask the peer for what we miss, then try again (the answer arrives as an MrUpdate).
      std::uint32_t missing = 0;
      bool found = false;
      v.lock().lock();
      v.send_ring().for_each_from(v.next_send_to_post(), [&](const SendRecord& record) {
        // The first request not posted is the one whose key was missing (post_pending stops
        // there); the same rule as the post says which key it names, if any.
        ibv_send_wr copy = record.wr;
        const std::uint32_t* rkey =
            record.remote_key_in(copy, v.send_ring().payload_length(record));
        std::uint32_t ignored = 0;
        if (rkey != nullptr && !translate_rkey(v.peer, *rkey, &ignored)) {
          found = true;
          missing = *rkey;
        }
        return false;
      });
      v.lock().unlock();
      if (found && !p.peer.local) send_to_peer(e, p, MrQuery{missing, p.remote.gid});
    }
    if (!v.holding() && v.mode() == PostMode::kRouted &&
        v.post_retry_due.exchange(false, std::memory_order_relaxed)) {
      v.lock().lock();
      v.post_pending();
      v.lock().unlock();
    }
    for (int path = 0; path < kPathCount; ++path) maybe_rearm(e, p, path);
    try_deferred_failback(e, p);
    probe_idle_standby(e, p, now, probe_round);
    continue_path_wait(e, p);
    if (p.pending_event != UINT32_MAX && !p.resume_late_reported && !p.sw.in_progress &&
        now > p.switched_monotonic_ns && now - p.switched_monotonic_ns > e.resume_late_ns &&
        v.awaiting_resume.load()) {
      p.resume_late_reported = true;
      report_late_resume(e, p);
    }
    if (p.pending_event != UINT32_MAX) {
      const std::uint64_t resumed = v.counters.resumed_unix_ns.load();
      if (resumed != 0 && !v.awaiting_resume.load()) {
        SwitchEvent& event = p.events[p.pending_event];
        event.resumed_unix_ns = resumed;
        VF_LOG_INFO("qp {}: traffic resumed on the {} path {:.3f} ms after the {} was detected",
                    v.vqpn, event.to, static_cast<double>(resumed - event.detected_unix_ns) / 1e6,
                    event.reason);
        p.pending_event = UINT32_MAX;
        v.counters.resumed_unix_ns.store(0);
      }
    }
  }
}

bool has_pending_work(Engine& e) {
  for (const auto& [app_srq, g] : e.srqs) {
    if (g.pending.active) return true;
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    if (p.pairing || p.start_pairing_pending || p.pending_event != UINT32_MAX ||
        p.rearm[0].needed || p.rearm[1].needed || p.sw.in_progress || p.failback_deferred ||
        p.path_wait.active || p.qp->translation_missing.load() || p.qp->post_retry_due.load() ||
        probe_in_flight(p)) {
      return true;
    }
  }
  return false;
}

}  // namespace vf::failover
