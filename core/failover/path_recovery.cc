#include "core/failover/path_recovery.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/failover/message_dispatch.h"
#include "core/failover/pair_end.h"
#include "core/failover/path_switch.h"
#include "core/failover/path_wait.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

void send_rearm(Engine& e, Protection& p, int path, bool is_reply, std::uint32_t nonce) {
  VirtualQp& v = *p.qp;
  vf::Rearm message;
  message.nonce = nonce;
  message.local = p.local;
  message.remote = p.remote;
  message.path = static_cast<std::uint8_t>(path);
  message.qpn = v.path[path].qp->qp_num;
  message.gid = v.path[path].gid;
  message.psn = v.path[path].psn;
  message.is_reply = is_reply;
  send_to_peer(e, p, message);
}

// Whether the path's own GID is in its port's table (refresh_gid_index); logs once per outage
// when it is not.
bool own_gid_present(Engine& e, Protection& p, int path) {
  RearmState& rearm = p.rearm[path];
  if (StepFailure failure; !refresh_gid_index(e, p, path, failure)) {
    if (!rearm.gid_wait_logged) {
      VF_LOG_WARN("qp {}: the {} path is not re-armed yet: {}", p.qp->vqpn, path_name(path),
                  failure.text());
      rearm.gid_wait_logged = true;
    }
    return false;
  }
  rearm.gid_wait_logged = false;
  return true;
}

bool held_down(const Protection& p, int path, std::uint64_t now) {
  return p.hold[path].until_ns != 0 && now < p.hold[path].until_ns;
}

// may_fail_back: only the side that asked for the re-arm (it connects last, when the reply
// arrives) starts the failback; the answering side's QP may still be reaching RTR otherwise.
void path_restored(Engine& e, Protection& p, int path, bool may_fail_back) {
  VirtualQp& v = *p.qp;
  p.hold[path].restored_ns = monotonic_ns();
  p.hold[path].until_ns = 0;
  v.path[path].connected = true;
  v.path[path].failed = false;
  // Done; the numbering of requests goes on (a later re-arm must not look older).
  p.rearm[path] = RearmState{.nonce = p.rearm[path].nonce,
                             .answered_nonce = p.rearm[path].answered_nonce,
                             .seen_nonce = p.rearm[path].seen_nonce};
  if (!p.unprotected_reason.empty() && p.paired) {
    VF_LOG_INFO("qp {}: protected again — the {} path is re-connected", v.vqpn, path_name(path));
    p.unprotected_reason.clear();
  }
  // A QP waiting for this path (path_wait.h) takes it now, asker or answerer: its active path is
  // dead, and the peer's switch request, if it comes first, finds the path connected.
  if (p.path_wait.active && p.path_wait.target == path) return continue_path_wait(e, p);
  if (may_fail_back && path == kPrimary && v.active_path() == kStandby && e.config.failback &&
      !p.sw.in_progress) {
    p.failback_deferred = true;
    try_deferred_failback(e, p);
  }
}

// One end of a pair asks for re-arming and the other answers, never both (two crossed requests
// would each reset the QP the other just connected): the asker is the smaller process token,
// or within one process the smaller QP key.
bool answers_rearm(Engine& e, const Protection& p) {
  if (!p.peer.local) return e.token > p.peer.token;
  if (p.local.qpn != p.remote.qpn) return p.local.qpn > p.remote.qpn;
  return p.local.gid > p.remote.gid;
}

}  // namespace

void try_deferred_failback(Engine& e, Protection& p) {
  if (!p.failback_deferred) return;
  VirtualQp& v = *p.qp;
  if (p.ended || p.sw.in_progress || v.active_path() != kStandby ||
      !v.path[kPrimary].connected || v.path[kPrimary].failed) {
    p.failback_deferred = false;  // no longer a failback to make (a switch came first)
    return;
  }
  // A failback stops the standby like any switch: an atomic in flight there would be lost and
  // fail the QP (finish_switch), though the standby works. It completes soon on a working path
  // (an unsignaled one retires with the next signaled completion).
  v.lock().lock();
  const bool atomic = v.send_ring().atomic_posted(v.next_send_to_post());
  v.lock().unlock();
  if (atomic) {
    VF_LOG_DEBUG("qp {}: failback waits for an atomic in flight on the standby", v.vqpn);
    return;
  }
  p.failback_deferred = false;
  start_switch(e, p, kPrimary, FailoverReason::kFailback);
}

bool hold_down_if_silent(Engine& e, Protection& p, int path, std::uint64_t now, bool seen_by_peer) {
  const PhysicalPath& physical = p.qp->path[path];
  // Asked of the device, not the cached state: a port going down fails the requests before its
  // event is read, and a hold for a port that is down would outlast the port's return.
  ibv_port_attr attr{};
  const bool active =
      e.verbs.query_port(e.devices[physical.device_index].context, physical.port, &attr) == 0
          ? attr.state == IBV_PORT_ACTIVE
          : port_active(e, physical.device_index, physical.port);
  if (!active) return false;
  HoldDown& hold = p.hold[path];
  const bool soon_after_rearm =
      hold.restored_ns != 0 && now - hold.restored_ns < kStableAfterRearmNs && hold.period_ns != 0;
  hold.period_ns =
      soon_after_rearm ? std::min(hold.period_ns * 2, kMaxHoldDownNs) : e.first_hold_down_ns;
  hold.until_ns = now + hold.period_ns;
  VF_LOG_INFO(
      "qp {}: its {} path failed with its port ACTIVE (a silent failure beyond the port, "
      "seen by {}); it is not re-armed for {:.1f} s{}",
      p.qp->vqpn, path_name(path), seen_by_peer ? "the peer" : "this side",
      static_cast<double>(hold.period_ns) / 1e9,
      soon_after_rearm ? " (it failed again soon after its last re-arm)" : "");
  // One path left for the hold (its re-arm says "protected again").
  set_unprotected(p, fmt::format("its {} path failed silently and is held down for {:.1f} s; "
                                 "running on the {} path alone",
                                 path_name(path), static_cast<double>(hold.period_ns) / 1e9,
                                 path_name(other_path(path))));
  return true;
}

void handle_rearm(Engine& e, const vf::Rearm& message) {
  Protection* p = protection_by_key(e, message.remote);
  if (p == nullptr || message.path > 1) return;
  VirtualQp& v = *p->qp;
  const int path = message.path;
  PhysicalPath& physical = v.path[path];
  // Failed for good (the application has seen its failure): no path comes back, and the peer
  // hears so instead of asking again (§5g). A pair the peer ended asks nothing.
  if (v.application_failed.load()) return answer_pair_ended(e, *p);
  if (p->ended) return;
  if (message.is_reply) {
    if (!p->rearm[path].awaiting || message.nonce != p->rearm[path].nonce) {
      VF_LOG_DEBUG("qp {}: stale re-arm reply for the {} path ignored", v.vqpn, path_name(path));
      return;
    }
    StepFailure failure;
    if (connect_path(e, *p, path, message.qpn, message.gid, message.psn, &failure)) {
      path_restored(e, *p, path, true);
    } else {
      VF_LOG_WARN("qp {}: connecting the {} path to the peer's answer failed: {}", v.vqpn,
                  path_name(path), failure.text());
      // Asked again at the re-arm retry, not at the next pass: the cause (a GID gone, a route)
      // does not go away in milliseconds. The peer, which connected its end and counts the path
      // restored, hears that it is not.
      p->rearm[path].awaiting = false;
      p->rearm[path].not_before_ns = monotonic_ns() + e.rearm_retry_ns;
      send_path_status(e, *p, path, false);
    }
    return;
  }
  // A request: ours too if our port is up and the path is idle.
  p->rearm[path].seen_nonce = std::max(p->rearm[path].seen_nonce, message.nonce);
  if (v.active_path() == path || p->sw.in_progress) return;
  // Not before our port has stayed up: our "up" notice (maybe_rearm) makes the asker ask again.
  if (!port_stable(e, physical.device_index, physical.port, monotonic_ns())) return;
  if (held_down(*p, path, monotonic_ns())) return;  // the asker asks again after its retry
  if (message.nonce <= p->rearm[path].answered_nonce) return;  // an older request, overtaken
  // Not while its own GID is gone: the path would be reset and not connected again. The asker
  // asks again at its retry; our "up" notice waits for the GID too (maybe_rearm).
  if (!own_gid_present(e, *p, path)) return;
  p->rearm[path].awaiting = false;
  physical.psn = random_psn();
  physical.connected = false;  // in RESET/INIT until connected again: no switch may go there
  StepFailure failure;
  if (!reset_path(e, *p, path, &failure) ||
      !connect_path(e, *p, path, message.qpn, message.gid, message.psn, &failure)) {
    VF_LOG_WARN("qp {}: re-connecting the {} path failed: {}", v.vqpn, path_name(path),
                failure.text());
    return;
  }
  p->rearm[path].answered_nonce = message.nonce;
  send_rearm(e, *p, path, true, message.nonce);
  // Our end is connected, the asker's only when this answer reaches it; if it is lost, only at its
  // next request (after its re-arm retry). No probe of the standby meanwhile (path_probe.h): it
  // would meet a QP in INIT and fail a sound path.
  if (path == kStandby) {
    p->probe.quiet_until_ns = monotonic_ns() + e.rearm_retry_ns + kProbeQuietAfterConnectNs;
  }
  path_restored(e, *p, path, false);
}

void maybe_rearm(Engine& e, Protection& p, int path) {
  VirtualQp& v = *p.qp;
  RearmState& rearm = p.rearm[path];
  if (p.ended || v.application_failed.load()) {
    rearm = RearmState{};  // nothing to re-arm, for good: no wake-up waits on it (has_pending_work)
    return;
  }
  if (!rearm.needed || p.sw.in_progress || v.active_path() == path) return;
  // A standby whose CQ's shadow overran is lost for good (port_events.cc, on_shadow_cq_error).
  if (path == kStandby && v.standby_lost()) return;
  const PhysicalPath& physical = v.path[path];
  const std::uint64_t now = monotonic_ns();
  // Neither asks nor says its port is back until the port has stayed up (a flap is not a repair).
  if (!port_stable(e, physical.device_index, physical.port, now)) return;
  if (held_down(p, path, now)) return;  // neither asks nor says its port is back
  if (now < rearm.not_before_ns) return;
  // Its own GID must be in the table (an address removed and not added again yet): asked now,
  // or told the port is back, the peer would connect its end to a path this end cannot connect
  // (issue 20 item 4). Looked at only when about to act: not at every pass of a wait.
  const auto gid_missing = [&] {
    if (own_gid_present(e, p, path)) return false;
    rearm.not_before_ns = now + e.rearm_retry_ns;
    return true;
  };
  if (p.local != p.remote && answers_rearm(e, p)) {
    // The peer asks; it must hear that it can now (its requests while our port was down went
    // unanswered, and it may not even know the port was down). Repeated: a notice may be lost.
    if (rearm.notice_sent_ns == 0 || now >= rearm.notice_sent_ns + e.rearm_retry_ns) {
      if (gid_missing()) return;
      rearm.notice_sent_ns = now;
      send_path_status(e, p, path, true);
    }
    return;
  }
  if (rearm.awaiting && now < rearm.sent_ns + e.rearm_retry_ns) return;
  if (gid_missing()) return;
  v.path[path].psn = random_psn();
  v.path[path].connected = false;  // in RESET/INIT until connected again: no switch may go there
  StepFailure failure;
  if (!reset_path(e, p, path, &failure)) {
    VF_LOG_WARN("qp {}: resetting the {} path for its re-arm failed: {}", v.vqpn, path_name(path),
                failure.text());
    return;
  }
  if (p.local == p.remote) {
    // A QP connected to itself (NCCL's flush QP): both ends are this QP.
    if (connect_path(e, p, path, v.path[path].qp->qp_num, v.path[path].gid, v.path[path].psn)) {
      path_restored(e, p, path, true);
    }
    return;
  }
  rearm.awaiting = true;
  rearm.sent_ns = now;
  send_rearm(e, p, path, false, ++rearm.nonce);
}

void send_path_status(Engine& e, Protection& p, int path, bool up) {
  if (p.local == p.remote) return;  // a QP connected to itself: this side is the peer
  if (p.ended) return;              // the pair is over: nothing more to say
  PathStatus status;
  status.local = p.local;
  status.remote = p.remote;
  status.path = static_cast<std::uint8_t>(path);
  status.up = up;
  // The asker's latest request; the answerer's latest request seen (PathStatus::rearm_nonce).
  status.rearm_nonce = answers_rearm(e, p) ? p.rearm[path].seen_nonce : p.rearm[path].nonce;
  if (!send_on_open_session(e, p, status)) {
    VF_LOG_DEBUG("qp {}: no session to the peer's shim; its {} path's {} notice is not sent",
                 p.qp->vqpn, path_name(path), up ? "up" : "down");
  }
}

void handle_path_status(Engine& e, const PathStatus& message) {
  Protection* p = protection_by_key(e, message.remote);
  if (p == nullptr || message.path > 1 || !p->paired || p->destroyed) return;
  if (p->remote != message.local) return;  // from an earlier pair of a reused QP number
  VirtualQp& v = *p->qp;
  const int path = message.path;
  if (v.application_failed.load()) return answer_pair_ended(e, *p);  // §5g
  if (p->ended) return;
  // A path that carries traffic (or is being switched to or from) is the handshake's business.
  if (v.active_path() == path || p->sw.in_progress) return;
  RearmState& rearm = p->rearm[path];
  const bool we_ask = !answers_rearm(e, *p);
  if (!message.up) {
    if (!we_ask) {
      // Sent before a re-arm the peer asked for and we answered since: the path is fine.
      if (message.rearm_nonce < rearm.answered_nonce) {
        VF_LOG_DEBUG("qp {}: stale notice of the peer's {} path ignored", v.vqpn, path_name(path));
        return;
      }
      // Its requests up to here were sent before its port went: none may connect us now.
      rearm.answered_nonce = message.rearm_nonce;
    }
    v.path[path].failed = true;
    rearm.needed = true;
    const PhysicalPath& ours = v.path[path];
    if (port_active(e, ours.device_index, ours.port)) {  // else our own reason says more
      set_unprotected(*p, fmt::format("the peer's end of its {} path failed (its port went down, "
                                      "or a probe of it failed); running on the {} path alone",
                                      path_name(path), path_name(v.active_path())));
    }
    return;
  }
  if (!we_ask) return;  // the peer asks itself
  // A request the peer has not seen yet will be answered: asking again would drop it.
  if (rearm.awaiting && rearm.nonce > message.rearm_nonce) return;
  rearm.needed = true;
  rearm.awaiting = false;  // ask now: a request sent while the peer's port was down went unanswered
  maybe_rearm(e, *p, path);
}

}  // namespace vf::failover
