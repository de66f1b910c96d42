#include "core/failover/path_switch.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/clock.h"
#include "core/failover/cq_shadows.h"
#include "core/failover/message_dispatch.h"
#include "core/failover/pair_end.h"
#include "core/failover/path_drain.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_wait.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/failover/srq_group.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

void post_switch_reset(Engine& e, Protection& p, int old_path) {
  VirtualQp& v = *p.qp;
  PhysicalPath& old = v.path[old_path];
  old.connected = false;
  const std::uint64_t start = monotonic_ns();
  if (!reset_path(e, p, old_path)) {
    VF_LOG_WARN("qp {}: resetting the {} QP for later re-use failed", v.vqpn, path_name(old_path));
  }
  VF_LOG_DEBUG("qp {}: the {} QP reset for re-use in {:.3f} ms", v.vqpn, path_name(old_path),
               static_cast<double>(monotonic_ns() - start) / 1e6);
  p.rearm[old_path].needed = true;
  p.rearm[old_path].awaiting = false;
}

// After finish_switch completed the requests of a QP with an atomic lost in flight as RC would
// (an error, then flushes): the path its traffic now uses goes to ERR, so that its receives and
// every later request flush as on the application's QP in ERR, and the pair ends (the peer is
// told).
void fail_for_lost_atomic(Engine& e, Protection& p, std::uint64_t atomic_wr_id) {
  VirtualQp& v = *p.qp;
  const int path = v.active_path();
  const std::string why = fmt::format(
      "atomic wr_id={:#x} was in flight when the {} path failed: whether it executed cannot be "
      "known and its result may be lost, so the QP fails as RC would (an error, then every later "
      "request and receive flushed)",
      atomic_wr_id, path_name(other_path(path)));
  VF_LOG_ERROR("qp {}: an atomic was lost in flight; the QP fails (its errors go to the "
               "application)",
               v.vqpn);
  if (!to_error(e, v.path[path].qp, path == kPrimary)) {
    VF_LOG_WARN("qp {}: moving its {} QP to ERR failed; its receives are not flushed", v.vqpn,
                path_name(path));
  }
  // What was posted meanwhile now flushes there. On the primary the application's QP takes its
  // posts itself from now on, as after any failure for good (release_held_errors).
  v.lock().lock();
  if (path == kPrimary) v.set_mode(PostMode::kBypass);
  v.set_holding(false);
  v.post_pending();
  v.lock().unlock();
  end_pair(e, p, why);
}

}  // namespace

void finish_switch(Engine& e, Protection& p) {
  VirtualQp& v = *p.qp;
  SwitchState& sw = p.sw;
  std::vector<const SendRecord*> replay, unrecoverable;
  std::uint64_t replayed = 0, synthesized = 0;
  v.send_cq->lock.lock();
  v.lock().lock();
  if (!v.send_ring().replay_set(sw.peer_count, replay, unrecoverable)) {
    VF_LOG_ERROR(
        "qp {}: the peer reports {} messages delivered but only {} were posted; "
        "replaying everything outstanding",
        v.vqpn, sw.peer_count, v.send_ring().messages_posted());
    v.send_ring().replay_set(0, replay, unrecoverable);
  }
  // An atomic in flight cannot be replayed (it may have executed; its result may be lost), and
  // RC's only outcome then is an error for the first request it could not complete and a flush
  // for every later one, fenced or not: the QP fails here as it would have without the shim
  // (issue 19 item 10, docs/design.md §5h). That first request is the earliest the peer did not
  // prove done: a request before the atomic that needed a replay would complete after it.
  // An atomic never posted (held during the switch, or behind a key the path lacked) is not
  // lost: it goes on the new path like any request held.
  const std::uint64_t posted_before = v.next_send_to_post();
  const SendRecord* lost_atomic = nullptr;
  if (!unrecoverable.empty() && unrecoverable.front()->sequence < posted_before) {
    lost_atomic = unrecoverable.front();
  }
  const std::uint64_t lost_atomic_wr_id = lost_atomic != nullptr ? lost_atomic->wr.wr_id : 0;
  std::uint64_t first_lost = UINT64_MAX;
  if (lost_atomic != nullptr) {
    first_lost = replay.empty() ? lost_atomic->sequence
                                : std::min(lost_atomic->sequence, replay.front()->sequence);
  }
  if (first_lost != UINT64_MAX) replay.clear();
  // A signaled request proven done behind one being replayed (an RDMA_READ is always replayed)
  // must not complete before it: RC completes a send queue in order. On the standby it goes
  // again as a stand-in (SendRecord::stand_in) and completes after it; the standby's peer QP is
  // the shim's, which allows remote writes (a zero-length WRITE to a QP without
  // IBV_ACCESS_REMOTE_WRITE fails on rxe and mlx5). On the primary, whose peer QP has the
  // application's access flags, it completes at once (docs/design.md §5h).
  const std::uint64_t first_replayed =
      replay.empty() || sw.to != kStandby ? UINT64_MAX : replay.front()->sequence;
  std::vector<std::uint64_t> keep;  // in ring order: sorted
  std::size_t stand_ins = 0;
  keep.reserve(replay.size());
  std::size_t replay_next = 0;
  v.send_ring().for_each_mutable([&](SendRecord& record) {
    if (replay_next < replay.size() && replay[replay_next]->sequence == record.sequence) {
      keep.push_back(record.sequence);
      ++replay_next;
    } else if (record.sequence > first_replayed && record.sequence < posted_before &&
               record.signaled) {
      keep.push_back(record.sequence);
      record.stand_in = true;
      ++stand_ins;
    }
  });
  // What the peer proved done completes now (its acknowledgement was lost with the path), in
  // order (docs/design.md §5).
  v.send_ring().for_each([&](const SendRecord& record) {
    ibv_wc wc{};
    wc.wr_id = record.wr.wr_id;
    wc.opcode = record.completion_opcode();
    wc.qp_num = v.vqpn;
    if (record.sequence >= first_lost) {
      // A device reports every failed or flushed request, signaled or not.
      wc.status = record.sequence == first_lost ? IBV_WC_RETRY_EXC_ERR : IBV_WC_WR_FLUSH_ERR;
      if (v.send_cq->stash_for_application(wc)) ++synthesized;
      return;
    }
    if (record.sequence >= posted_before) return;  // never posted: nothing to prove
    const bool replaying = std::binary_search(keep.begin(), keep.end(), record.sequence);
    if (replaying || !record.signaled) return;
    wc.status = IBV_WC_SUCCESS;
    if (v.send_cq->stash_for_application(wc)) ++synthesized;
  });
  v.send_ring().compact([&](const SendRecord& record) {
    return record.sequence < first_lost &&
           (record.sequence >= posted_before ||
            std::binary_search(keep.begin(), keep.end(), record.sequence));
  });
  // The new path failed while the switch went there (its port went down during a failback): the
  // traffic goes back (below), so what waits to be posted stays held, not sent to a dead path.
  const bool going_back = first_lost == UINT64_MAX && v.path[sw.to].failed && !p.ended &&
                          may_wait_for_path(e, p, sw.from);
  if (first_lost != UINT64_MAX) {
    // Its errors are shown: failed for good (no re-arm, no failback), as after a double failure.
    // Posts stay held until the new path is in ERR (fail_for_lost_atomic): none may reach the
    // peer once the application holds an error of an earlier request.
    v.application_failed.store(true);
  }
  replayed = keep.size() - stand_ins;
  synthesized += stand_ins;
  std::uint64_t first = v.send_ring().next_sequence();
  v.send_ring().for_each_from(0, [&](const SendRecord& record) {
    first = record.sequence;
    return false;
  });
  v.restart_sends(first);
  const bool resume_posts = first_lost == UINT64_MAX && !going_back;
  if (resume_posts) v.set_holding(false);
  v.link_error_seen.store(false);
  v.drop_held_errors();  // replaced by the replay
  if (resume_posts) v.post_pending();
  if (v.send_ring().outstanding() == 0 && v.recv_ring().pending() == 0) {
    // Nothing to wait for on this side (a passive RDMA target): its traffic resumed with the
    // switch itself.
    v.counters.resumed_unix_ns.store(realtime_ns(), std::memory_order_relaxed);
  } else {
    v.awaiting_resume.store(true, std::memory_order_relaxed);
  }
  if (sw.to == kPrimary && !v.application_failed.load() && !going_back) {
    v.set_mode(PostMode::kDirect);
  }
  v.lock().unlock();
  v.send_cq->lock.unlock();

  v.counters.replayed_wrs.fetch_add(replayed, std::memory_order_relaxed);
  v.counters.synthesized_completions.fetch_add(synthesized, std::memory_order_relaxed);
  if (sw.reason == FailoverReason::kFailback) {
    ++p.failbacks;
  } else {
    ++p.failovers;
  }
  SwitchEvent event;
  event.kind = sw.reason == FailoverReason::kFailback ? "failback" : "failover";
  event.reason = reason_name(sw.reason);
  event.from = path_name(sw.from);
  event.to = path_name(sw.to);
  event.detected_unix_ns = sw.detected_unix_ns;
  event.replayed_wrs = replayed;
  p.events.push_back(event);
  p.pending_event = static_cast<std::uint32_t>(p.events.size() - 1);
  p.switched_monotonic_ns = monotonic_ns();
  p.resume_late_reported = false;
  VF_LOG_INFO(
      "qp {}: {} {} -> {} done ({}): peer had delivered {} message(s), we {}; replayed "
      "{} request(s), completed {} proven done ({} behind a replay, by stand-ins), in {:.3f} ms",
      v.vqpn, event.kind, event.from, event.to, event.reason, sw.peer_count, sw.local_count,
      replayed, synthesized, stand_ins,
      static_cast<double>(monotonic_ns() - sw.started_monotonic_ns) / 1e6);
  const int old_path = sw.from;
  sw.in_progress = false;
  post_switch_reset(e, p, old_path);
  if (old_path == kStandby) {
    retire_shadow_if_unused(e, *v.send_cq);
    if (v.recv_cq != v.send_cq) retire_shadow_if_unused(e, *v.recv_cq);
  }
  if (first_lost != UINT64_MAX) return fail_for_lost_atomic(e, p, lost_atomic_wr_id);
  if (v.path[sw.to].failed && !p.ended) {
    // Back to the path that works, once it is re-armed (path_wait.h), not errors on the dead one
    // (without a grace, or on an SRQ, the switch back reports the QP unprotected at least).
    VF_LOG_WARN("qp {}: its {} path failed during the switch to it; its traffic goes back to "
                "the {} path",
                v.vqpn, path_name(sw.to), path_name(old_path));
    start_switch(e, p, old_path, FailoverReason::kPortDown);
  }
}

bool begin_switch(Engine& e, Protection& p, int target, FailoverReason reason, std::uint32_t epoch,
                  bool initiator) {
  VirtualQp& v = *p.qp;
  if (!v.claim_for_switch()) {
    // The application's data path made it pass-through since can_switch_to looked (its post of
    // a request the ring cannot replay): no switch (periodic_work ends the pair).
    VF_LOG_INFO("qp {}: no switch: the QP became pass-through as it began", v.vqpn);
    return false;
  }
  SwitchState& sw = p.sw;
  const int from = v.active_path();
  p.path_wait = PathWait{};  // a wait for a path ends with this switch (path_wait.h)
  sw = SwitchState{};
  sw.in_progress = true;
  sw.from = from;
  sw.to = target;
  sw.epoch = epoch;
  sw.reason = reason;
  sw.initiator = initiator;
  sw.detected_unix_ns = realtime_ns();
  sw.started_monotonic_ns = monotonic_ns();
  p.epoch = epoch;
  VF_LOG_INFO("qp {}: switching {} -> {} ({}, epoch {})", v.vqpn, path_name(from),
              path_name(target), reason_name(reason), epoch);
  // After this the old path's responder drops whatever still arrives: nothing the peer sends
  // on it can be delivered behind our count.
  const std::uint64_t stop_start = monotonic_ns();
  ibv_qp_attr stop{};
  stop.qp_state = IBV_QPS_ERR;
  const int stop_result = modify(e, v.path[from].qp, &stop, IBV_QP_STATE, from == kPrimary);
  const bool in_error = stop_result == 0;
  if (!in_error) {
    VF_LOG_WARN(
        "qp {}: the {} path could not be moved to ERR ({}); its drain takes what its CQ "
        "holds",
        v.vqpn, path_name(from), strerror(stop_result));
  }
  const std::uint64_t drain_start = monotonic_ns();
  drain_old_path(e, p, from, in_error);
  VF_LOG_DEBUG("qp {}: the {} path stopped (ERR {:.3f} ms, drained {:.3f} ms)", v.vqpn,
               path_name(from), static_cast<double>(drain_start - stop_start) / 1e6,
               static_cast<double>(monotonic_ns() - drain_start) / 1e6);
  if (target == kStandby) {
    v.send_cq->shadow_active.store(true);
    v.recv_cq->shadow_active.store(true);
  }
  v.lock().lock();
  v.set_accepting(from, false);
  sw.local_count = v.recv_ring().delivered_messages();
  v.set_active_path(target);
  v.set_accepting(target, true);
  v.restart_receives();
  v.post_pending(false);
  v.open_receives();
  v.link_error_seen.store(false);
  v.lock().unlock();
  sw.local_ready = true;
  return true;
}

bool can_switch_to(const Protection& p, int target) {
  const VirtualQp& v = *p.qp;
  return p.paired && !p.ended && v.path[target].connected && !v.path[target].failed &&
         !v.application_failed.load() && v.mode() != PostMode::kBypass &&
         !(target == kStandby && v.standby_lost());
}

void release_held_errors(Protection& p) {
  VirtualQp& v = *p.qp;
  std::vector<VirtualQp::HeldError> held;
  v.lock().lock();
  v.take_held_errors(held);
  v.retire_released_srq_receives(held);
  if (v.active_path() == kPrimary) v.set_mode(PostMode::kBypass);
  v.application_failed.store(true);
  v.lock().unlock();
  for (const VirtualQp::HeldError& error : held) {
    error.cq->lock.lock();
    error.cq->stash_for_application(error.wc);
    error.cq->lock.unlock();
  }
  if (!held.empty()) {
    VF_LOG_WARN("qp {}: {} error completion(s) go to the application: no path is left", v.vqpn,
                held.size());
  }
}

std::vector<ibv_wc> unposted_request_flushes_locked(const VirtualQp& v) {
  std::vector<ibv_wc> flushed;
  v.send_ring().for_each_from(v.next_send_to_post(), [&](const SendRecord& record) {
    ibv_wc wc{};
    wc.wr_id = record.wr.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = record.completion_opcode();
    wc.qp_num = v.vqpn;
    flushed.push_back(wc);
    return true;
  });
  return flushed;
}

void abort_switch(Protection& p, const char* why) {
  VirtualQp& v = *p.qp;
  VF_LOG_ERROR(
      "qp {}: the switch to the {} path cannot complete ({}); the application sees the "
      "failure",
      v.vqpn, path_name(p.sw.to), why);
  // Requests posted during the attempt reached no QP: each completes as the application's QP in
  // ERR would have completed it, with a flush, signaled or not (a device reports every flushed
  // WR, so that its owner can reclaim the buffers: rxe's flush_send_queue, mlx5 alike).
  v.lock().lock();
  const std::vector<ibv_wc> flushed = unposted_request_flushes_locked(v);
  v.set_holding(false);
  v.set_mode(PostMode::kBypass);
  // Pass-through posts go to the application's own QP: its completions (flushes, on a dead
  // path) are the application's again.
  v.set_active_path(kPrimary);
  v.set_accepting(kPrimary, true);
  v.lock().unlock();
  p.sw.in_progress = false;
  release_held_errors(p);
  v.send_cq->lock.lock();
  for (const ibv_wc& wc : flushed) v.send_cq->stash_for_application(wc);
  v.send_cq->lock.unlock();
  set_unprotected(p, fmt::format("a switch failed ({})", why));
}

void start_switch(Engine& e, Protection& p, int target, FailoverReason reason) {
  VirtualQp& v = *p.qp;
  if (p.sw.in_progress || v.active_path() == target) return;
  if (!can_switch_to(p, target)) {
    // Not usable yet, but it may be soon (a re-arm, a port's return): the QP waits for a path
    // rather than fail now (path_wait.h).
    if (reason != FailoverReason::kFailback && may_wait_for_path(e, p, target) &&
        wait_for_path(e, p, target, reason)) {
      return;
    }
    // A QP failed for good has its reason already (or, taken down by the application, needs none).
    const bool failed_before = v.application_failed.load();
    if (v.link_error_seen.load() || reason == FailoverReason::kErrorCompletion) {
      release_held_errors(p);
    }
    if (reason != FailoverReason::kFailback && !failed_before) {
      std::string why = fmt::format("its {} path failed and the {} path is not usable; the "
                                    "application sees the failure",
                                    path_name(v.active_path()), path_name(target));
      // Errors shown: failed for good, and the peer is told (§5g).
      if (v.application_failed.load()) {
        end_pair(e, p, std::move(why));
      } else {
        set_unprotected(p, std::move(why));
      }
    }
    return;
  }
  if (SrqGroup* group = group_of(e, v))
    return switch_srq_group(e, *group, target, reason, nullptr, 0, 0);
  // Refused: pass-through as it began; the path that cannot take the switch decides, as above.
  if (!begin_switch(e, p, target, reason, p.epoch + 1, true)) {
    return start_switch(e, p, target, reason);
  }
  ask_peer_to_switch(e, p, reason);
}

namespace {

FailoverRequest switch_request(const Protection& p, FailoverReason reason) {
  FailoverRequest request;
  request.local = p.local;
  request.remote = p.remote;
  request.delivered_messages = p.sw.local_count;
  request.reason = static_cast<std::uint32_t>(reason);
  request.epoch = p.sw.epoch;
  request.target_path = static_cast<std::uint8_t>(p.sw.to);
  return request;
}

FailoverReply switch_reply(const Protection& p) {
  FailoverReply reply;
  reply.local = p.local;
  reply.remote = p.remote;
  reply.delivered_messages = p.sw.local_count;
  reply.epoch = p.sw.epoch;
  reply.target_path = static_cast<std::uint8_t>(p.sw.to);
  return reply;
}

}  // namespace

void ask_peer_to_switch(Engine& e, Protection& p, FailoverReason reason) {
  p.sw.request_sent_ns = monotonic_ns();
  if (!send_to_peer(e, p, switch_request(p, reason))) {
    return abort_switch(p, "the peer's shim cannot be reached");
  }
  if (p.sw.peer_known) finish_switch(e, p);
}

void resend_switch_request(Engine& e, Protection& p, std::uint64_t now) {
  SwitchState& sw = p.sw;
  if (!sw.in_progress || !sw.initiator || sw.peer_known || sw.request_sent_ns == 0 ||
      now < sw.request_sent_ns + kSwitchResendNs ||
      now >= sw.started_monotonic_ns + kSwitchResendUntilNs) {
    return;
  }
  sw.request_sent_ns = now;
  ++sw.resends;
  VF_LOG_INFO("qp {}: no answer to its switch request (epoch {}) yet; sent again ({})", p.qp->vqpn,
              sw.epoch, sw.resends);
  // On the session in use and on a session to each other address of the peer: the one in use
  // may be dead without a sign yet (its network's link down; TCP gives up on it only after
  // seconds), while another network still reaches the peer. New connections are started, never
  // waited for (the engine's lock is held); the deadline aborts the switch.
  if (send_on_every_route(e, p, switch_request(p, sw.reason), sw.resends) == 0) {
    VF_LOG_DEBUG("qp {}: no route to the peer; the switch request waits for the next resend",
                 p.qp->vqpn);
  }
}

void handle_failover(Engine& e, const QpKey& ours, std::uint64_t delivered, std::uint32_t epoch,
                     std::uint8_t target, bool is_request, FailoverReason reason) {
  Protection* p = protection_by_key(e, ours);
  if (p == nullptr) return;
  SwitchState& sw = p->sw;
  if (is_request && reason == FailoverReason::kPortDown) {
    // The peer's port went down: what this side saw fail on the path (its requests' retries
    // running out, its own port ACTIVE) is explained, and a hold it took for a silent failure
    // would outlast the port's return. Requests may cross: this side may have switched first.
    const int path = sw.in_progress ? sw.from : other_path(p->qp->active_path());
    if (p->hold[path].until_ns != 0) {
      VF_LOG_INFO("qp {}: the peer's port went down: its {} path is no longer held down",
                  p->qp->vqpn, path_name(path));
      p->hold[path] = HoldDown{};
    }
  }
  if (sw.in_progress && sw.epoch == epoch) {
    const std::uint64_t target_restored = p->hold[target].restored_ns;
    if (is_request && reason == FailoverReason::kFailback &&
        sw.reason == FailoverReason::kErrorCompletion && sw.to == target &&
        target_restored != 0 && sw.started_monotonic_ns >= target_restored &&
        sw.started_monotonic_ns - target_restored < kSwitchAnswerTimeoutNs) {
      // Crossed with the peer's failback, soon after this side answered the re-arm of the path
      // it fails back to: its first step moved its end of our old path to ERR, and our requests
      // there ran out of retries before its request (sent after its drain) arrived. Those errors
      // were the failback's own, not a failure of the path: no hold (its length is kept for the
      // next real one), and the switch counts as the failback it is.
      VF_LOG_INFO("qp {}: the errors on the {} path came from the peer's failback, not a "
                  "failure: it is not held down",
                  p->qp->vqpn, path_name(sw.from));
      p->hold[sw.from].until_ns = 0;
      sw.reason = FailoverReason::kFailback;
    }
    sw.peer_known = true;
    sw.peer_count = delivered;
    if (sw.local_ready) finish_switch(e, *p);
    return;
  }
  if (is_request && sw.epoch == epoch && (!sw.in_progress || !sw.initiator)) {
    // The request of a switch this side answered, or crossed with its own and finished, again (its
    // sender heard nothing: lost with a session): done, the same answer goes again, which the
    // sender takes as the answer (or, crossed, as the crossing) and a second time as stale; while
    // this side still answers it, it changes nothing.
    if (!sw.in_progress && p->epoch == epoch && p->qp->active_path() == target && !p->ended &&
        !p->qp->application_failed.load()) {
      VF_LOG_INFO("qp {}: the peer repeats its switch request (epoch {}); answered again",
                  p->qp->vqpn, epoch);
      send_on_open_session(e, *p, switch_reply(*p));
      return;
    }
    if (!sw.in_progress && p->qp->application_failed.load()) return answer_pair_ended(e, *p);
    if (sw.in_progress) return;
  }
  if (!is_request || sw.in_progress || epoch <= p->epoch) {
    VF_LOG_DEBUG("qp {}: stale failover message (epoch {}, ours {})", p->qp->vqpn, epoch, p->epoch);
    return;
  }
  if (p->qp->active_path() == target) return;
  if (p->qp->application_failed.load() || p->qp->mode() == PostMode::kBypass) {
    // Failed for good, or pass-through for good: the peer must not wait for an answer.
    VF_LOG_INFO("qp {}: the peer asks for a switch, but the QP is failed or pass-through for good",
                p->qp->vqpn);
    return answer_pair_ended(e, *p);
  }
  if (p->ended) {
    VF_LOG_DEBUG("qp {}: the peer asks for a switch after its QP failed for good", p->qp->vqpn);
    return;
  }
  if (target == kStandby && p->qp->standby_lost()) {
    // Its shadow CQ overran (port_events.cc): the standby is lost for good, the pair over.
    return answer_pair_ended(e, *p);
  }
  // The peer switches: so do we, whatever our ports say (its side of the path failed). If it saw
  // the path fail silently, this end holds it down too: the two ends then hold and lengthen their
  // holds together, whichever of them sees the next silent failure first.
  if (reason == FailoverReason::kErrorCompletion) {
    hold_down_if_silent(e, *p, p->qp->active_path(), monotonic_ns(), true);
  }
  if (SrqGroup* group = group_of(e, *p->qp)) {
    return switch_srq_group(e, *group, target, reason, p, epoch, delivered);
  }
  if (!begin_switch(e, *p, target,
                    reason == FailoverReason::kFailback ? reason : FailoverReason::kPeerRequest,
                    epoch, false)) {
    return answer_pair_ended(e, *p);
  }
  answer_failover(e, *p, delivered);
}

void answer_failover(Engine& e, Protection& p, std::uint64_t delivered) {
  SwitchState& sw = p.sw;
  sw.peer_known = true;
  sw.peer_count = delivered;
  send_to_peer(e, p, switch_reply(p));
  finish_switch(e, p);
}

}  // namespace vf::failover
