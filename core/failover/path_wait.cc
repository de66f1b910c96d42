#include "core/failover/path_wait.h"

#include <optional>
#include <vector>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/failover/pair_end.h"
#include "core/failover/path_switch.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// The wait ends with no error seen and the active path's port up and stable (it blinked, and RC's
// retries may have covered it): the QP goes on where it is, its held requests posted there,
// unprotected; the pair stays on. If the path is dead after all, its errors start a wait of their
// own, and that one ends in the application's error.
void resume_on_active_path(Protection& p, const char* why) {
  VirtualQp& v = *p.qp;
  const int active = v.active_path();
  p.path_wait = PathWait{};
  v.path[active].failed = false;
  VF_LOG_WARN("qp {}: {}; no error was seen, so it goes on on its {} path", v.vqpn, why,
              path_name(active));
  v.lock().lock();
  v.set_holding(false);
  v.post_pending();
  // On its primary, posts go straight to the provider again (as after a failback), once the ring
  // has nothing left to post (a request the provider refused is retried by the engine, routed).
  if (active == kPrimary && v.next_send_to_post() == v.send_ring().next_sequence() &&
      !v.post_retry_due.load(std::memory_order_relaxed) && !v.translation_missing.load()) {
    v.set_mode(PostMode::kDirect);
  }
  v.lock().unlock();
  set_unprotected(p, fmt::format("its {} path is not usable; running on the {} path alone",
                                 path_name(other_path(active)), path_name(active)));
}

// The QP's oldest request, when no request before it is outstanding and the wait held it (it
// reached no QP): retired, and its completion as the dead path would have given it (a requester
// whose peer never answers: RETRY_EXC_ERR, reported signaled or not, as every failed request is).
std::optional<ibv_wc> fail_oldest_held_request_locked(VirtualQp& v) {
  RetransmitRing& ring = v.send_ring();
  const std::uint64_t oldest = v.next_send_to_post();
  bool held_first = false;
  ring.for_each_from(0, [&](const SendRecord& record) {
    held_first = record.sequence == oldest;
    return false;  // the oldest outstanding only
  });
  SendRecord record;
  if (!held_first || !ring.retire_sequence(oldest, record)) return std::nullopt;
  v.restart_sends(oldest + 1);
  ibv_wc wc{};
  wc.wr_id = record.wr.wr_id;
  wc.status = IBV_WC_RETRY_EXC_ERR;
  wc.opcode = record.completion_opcode();
  wc.qp_num = v.vqpn;
  return wc;
}

// Whether the QP can go on on its active path: the wait began with that path's port down, the
// port is ACTIVE again (and, before the grace is over, stable), and no error was seen on it.
bool active_path_usable(Engine& e, Protection& p, bool require_stable) {
  VirtualQp& v = *p.qp;
  if (!p.path_wait.active_port_down || p.ended || v.application_failed.load()) return false;
  if (v.active_path() == kStandby && v.standby_lost()) return false;
  v.lock().lock();
  const bool errors = v.has_held_errors();
  v.lock().unlock();
  const PhysicalPath& physical = v.path[v.active_path()];
  return !errors && port_active(e, physical.device_index, physical.port) &&
         (!require_stable || port_stable(e, physical.device_index, physical.port, monotonic_ns()));
}

}  // namespace

bool may_wait_for_path(const Engine& e, const Protection& p, int target) {
  const VirtualQp& v = *p.qp;
  // A QP on a shared receive queue moves with its group (srq_group.cc), which decides for all its
  // members at once: it does not wait on its own.
  return e.grace_ns > 0 && p.paired && !p.ended && !v.application_failed.load() &&
         v.mode() != PostMode::kBypass && v.srq == nullptr &&
         !(target == kStandby && v.standby_lost());
}

bool wait_for_path(Engine& e, Protection& p, int target, FailoverReason reason) {
  VirtualQp& v = *p.qp;
  if (p.path_wait.active) return true;
  // Held like a switch holds them: a request posted now must not meet the dead path (its error
  // would be one more to hide) nor a path whose peer's count is not known yet.
  if (!v.claim_for_switch()) return false;
  // Receives go on to the active path: on its QP in ERR they flush, hidden like its other errors;
  // the switch posts them again on the new path, and an end without one shows their flushes.
  // One posted while the claim held them is posted now.
  v.lock().lock();
  v.open_receives();
  v.post_pending(false);
  v.lock().unlock();
  const std::uint64_t now = monotonic_ns();
  const PhysicalPath& active = v.path[v.active_path()];
  p.path_wait = PathWait{true, target, reason, now, now + e.grace_ns,
                         !port_active(e, active.device_index, active.port)};
  VF_LOG_WARN("qp {}: its {} path failed and its {} path is not usable yet; its work waits up to "
              "{} ms (VERBS_FAILOVER_GRACE_MS) for a path to come back",
              v.vqpn, path_name(v.active_path()), path_name(target), e.grace_ns / 1'000'000);
  set_unprotected(p, fmt::format("its {} path failed and its {} path is not usable yet; waiting "
                                 "for a path",
                                 path_name(v.active_path()), path_name(target)));
  return true;
}

void continue_path_wait(Engine& e, Protection& p) {
  if (!p.path_wait.active) return;
  VirtualQp& v = *p.qp;
  const PathWait wait = p.path_wait;
  if (can_switch_to(p, wait.target)) {
    VF_LOG_INFO("qp {}: its {} path is usable again {:.1f} ms into the wait; its traffic moves "
                "there",
                v.vqpn, path_name(wait.target),
                static_cast<double>(monotonic_ns() - wait.since_ns) / 1e6);
    p.path_wait = PathWait{};
    start_switch(e, p, wait.target, wait.reason);
    return;
  }
  if (p.ended || v.application_failed.load()) {
    return end_path_wait(e, p, "the pair ended while its QP waited for a path");
  }
  if (active_path_usable(e, p, true)) {
    return resume_on_active_path(p, "the port of its active path is back before its other path");
  }
  if (monotonic_ns() >= wait.until_ns) {
    end_path_wait(e, p,
                  fmt::format("no path is left: none came back within {} ms "
                              "(VERBS_FAILOVER_GRACE_MS); the application sees its QP fail, and "
                              "the QP stays failed as it would without the shim",
                              e.grace_ns / 1'000'000));
  }
}

void end_path_wait(Engine& e, Protection& p, const std::string& why) {
  if (!p.path_wait.active) return;
  VirtualQp& v = *p.qp;
  // The grace is over: a port back but not yet stable (VERBS_FAILOVER_PORT_STABLE_MS may be
  // longer than the grace) is taken rather than fail a QP that saw no error.
  if (active_path_usable(e, p, false)) {
    return resume_on_active_path(p, "its other path did not come back");
  }
  p.path_wait = PathWait{};
  VF_LOG_ERROR("qp {}: {}", v.vqpn, why);
  // No error of the QP was seen (its port went down before any request met it) and the wait
  // did not end by the application's hand (its own ERR, or an error it saw): an RC QP does not
  // go to ERR with flushes alone, so its oldest request, if the wait held it, fails as it would
  // have on the dead path, before anything else of the QP can be polled (the rest flush after
  // it). With a held error it is that error that comes first; a QP the application moved to ERR
  // flushes everything, as RC does.
  v.send_cq->lock.lock();
  v.lock().lock();
  if (!v.application_failed.load() && !v.holds_a_failure()) {
    if (std::optional<ibv_wc> error = fail_oldest_held_request_locked(v)) {
      v.send_cq->stash_for_application(*error);
    }
  }
  v.lock().unlock();
  v.send_cq->lock.unlock();
  // Its active path stays dead for the application from here, as a QP in ERR: later requests
  // flush too, even if its port comes back (no success after the flushes shown below).
  const int active = v.active_path();
  if (!v.application_failed.load() && !to_error(e, v.path[active].qp, active == kPrimary)) {
    VF_LOG_WARN("qp {}: moving its {} QP to ERR failed", v.vqpn, path_name(active));
  }
  // The held errors first: they are of requests and receives posted before those held since.
  // After it (application_failed, under the QP's lock) every error of either path is shown.
  release_held_errors(p);
  v.errors_wait_for_path.store(false);
  std::vector<ibv_wc> flushed;
  v.lock().lock();
  if (v.mode() == PostMode::kBypass) {
    // On its own QP (release_held_errors made it pass-through): what the wait held reached no QP,
    // and completes as on a QP in ERR, signaled or not, in order.
    flushed = unposted_request_flushes_locked(v);
    v.restart_sends(v.send_ring().next_sequence());
  }
  v.set_holding(false);
  // On the standby: what was held goes to its QP, whose flushes the application now sees.
  if (v.mode() != PostMode::kBypass) v.post_pending();
  v.lock().unlock();
  v.send_cq->lock.lock();
  for (const ibv_wc& wc : flushed) v.send_cq->stash_for_application(wc);
  v.send_cq->lock.unlock();
  end_pair(e, p, why);
}

}  // namespace vf::failover
