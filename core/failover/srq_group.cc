#include "core/failover/srq_group.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/pair_end.h"
#include "core/failover/path_switch.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/failover/srq_sweep.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

bool srq_member_in_use(const Protection& q) {
  return !q.destroyed && !q.qp->application_failed.load() && q.qp->mode() != PostMode::kBypass;
}

// A QP of a moving SRQ that cannot move with it, or whose failure keeps the SRQ where it is: it
// fails as it would have without the shim (its QPs to ERR, its errors to the application in
// order, its peer told the pair is over). Its CQs are drained after the ERR: a receive it
// completed that the application has not polled yet retires its SRQ record now, so a move never
// posts that buffer again while it holds a message.
void give_up_member(Engine& e, Protection& q, const std::string& why) {
  VirtualQp& v = *q.qp;
  const int path = v.active_path();
  // The errors held so far come before the flushes below; and with the QP failed for good
  // (release_held_errors says so), the drain holds none: each goes to the application.
  release_held_errors(q);
  to_error(e, v.path[path].qp, path == kPrimary);
  v.send_cq->drain_into_stash(path);
  if (v.recv_cq != v.send_cq) v.recv_cq->drain_into_stash(path);
  if (path == kStandby) {
    // Pass-through posts go to the application's own QP, which may have been re-armed: it fails
    // too, and its completions are the application's (as abort_switch does). The standby's
    // flushes that come later are translated (on_completion_locked: a standby error is never
    // passed through as it is).
    if (!to_error(e, v.path[kPrimary].qp, true)) {
      VF_LOG_WARN("qp {}: moving its own QP to ERR failed; its posts go there", v.vqpn);
    }
  }
  v.lock().lock();
  const std::vector<ibv_wc> unposted = unposted_request_flushes_locked(v);
  v.set_holding(false);
  v.set_active_path(kPrimary);
  v.set_accepting(kPrimary, true);
  v.set_mode(PostMode::kBypass);
  v.lock().unlock();
  v.send_cq->lock.lock();
  for (const ibv_wc& wc : unposted) v.send_cq->stash_for_application(wc);
  v.send_cq->lock.unlock();
  v.link_error_seen.store(false);  // its errors are the application's: no switch is due
  end_pair(e, q, why);
}

// Whether a member's connection is known to have failed: its own path, or its peer's side (the
// peer asked for the move). One that has not would have kept working without the shim.
bool member_path_failed(const Protection& q, bool peer_asked) {
  const VirtualQp& v = *q.qp;
  return peer_asked || v.path[v.active_path()].failed || v.link_error_seen.load();
}

// A member whose pairing is in flight and whose own path still works: the SRQ's move waits for it.
bool srq_member_still_pairing(const Protection& q) {
  const VirtualQp& v = *q.qp;
  return !q.paired && (q.pairing || q.start_pairing_pending) && !v.path[v.active_path()].failed &&
         !v.link_error_seen.load();
}

// A failover the SRQ cannot make (a member that works cannot follow, or the other path's SRQ
// could not be swept): the SRQ stays; the members whose connection failed get the failure they
// would have got without the shim, and the others go on as they are.
void stay_put(Engine& e, SrqGroup& g, const std::vector<Protection*>& members,
              const std::vector<SrqGroup::PassiveMember>& passives, const std::string& why) {
  g.pending = {};
  for (Protection* q : members) {
    const bool peer_asked = std::any_of(passives.begin(), passives.end(),
                                        [&](const auto& m) { return m.q == q; });
    if (member_path_failed(*q, peer_asked)) give_up_member(e, *q, why);
  }
}

}  // namespace

SrqGroup* group_of(Engine& e, const VirtualQp& v) {
  if (v.srq == nullptr) return nullptr;
  auto it = e.srqs.find(v.srq->app_srq);
  return it == e.srqs.end() ? nullptr : &it->second;
}

void switch_srq_group(Engine& e, SrqGroup& g, int target, FailoverReason reason,
                      Protection* passive, std::uint32_t passive_epoch,
                      std::uint64_t passive_delivered) {
  VirtualSrq& srq = *g.srq;
  std::vector<SrqGroup::PassiveMember> passives = std::move(g.pending.passives);
  g.pending.passives.clear();
  if (passive != nullptr) {
    auto known = std::find_if(passives.begin(), passives.end(),
                              [&](const auto& m) { return m.q == passive; });
    const bool repeated = known != passives.end() && known->epoch == passive_epoch;
    if (known == passives.end()) known = passives.insert(passives.end(), {passive});
    known->epoch = passive_epoch;
    known->delivered = passive_delivered;
    // A request the peer repeats (kSwitchResendNs) does not restart the member's wait.
    if (!repeated) known->asked_ns = monotonic_ns();
  }
  auto passive_of = [&](const Protection* q) -> const SrqGroup::PassiveMember* {
    for (const auto& m : passives) {
      if (m.q == q) return &m;
    }
    return nullptr;
  };
  std::vector<Protection*> movers, blocked, waiting;
  for (VirtualQp* member : g.members) {
    auto it = e.protections.find(member);
    if (it == e.protections.end()) continue;
    Protection& q = it->second;
    if (passive_of(&q) != nullptr && srq_member_in_use(q) && !q.sw.in_progress && q.paired &&
        !q.ended) {
      movers.push_back(&q);
      continue;
    }
    if (!srq_member_in_use(q) || q.sw.in_progress || q.qp->active_path() == target) continue;
    if (can_switch_to(q, target)) {
      movers.push_back(&q);
    } else if (reason != FailoverReason::kFailback && srq_member_still_pairing(q)) {
      waiting.push_back(&q);
    } else {
      blocked.push_back(&q);
    }
  }
  if (movers.empty()) {
    g.pending = {};
    return;
  }
  if (reason == FailoverReason::kFailback && !blocked.empty()) {
    VF_LOG_DEBUG("srq {:#x}: failback waits for {} more QP(s) to be re-connected",
                 srq.app_srq->handle, blocked.size());
    // A peer that asked is answered when the move happens (periodic_work retries it), within
    // kSrqFailbackWaitNs of its request, well before its switch stops waiting for the answer;
    // after that it is told the pair is over rather than left to time out.
    const std::uint64_t now = monotonic_ns();
    std::erase_if(passives, [&](const SrqGroup::PassiveMember& m) {
      if (now - m.asked_ns <= kSrqFailbackWaitNs) return false;
      VF_LOG_WARN("srq {:#x}: the failback the peer of qp {} asked for cannot happen within {} s "
                  "({} QP(s) on it not re-connected); the pair ends",
                  srq.app_srq->handle, m.q->qp->vqpn, kSrqFailbackWaitNs / 1'000'000'000,
                  blocked.size());
      answer_pair_ended(e, *m.q);
      return true;
    });
    g.pending = {};
    if (passives.empty()) return;
    g.pending.active = true;
    g.pending.target = target;
    g.pending.reason = reason;
    g.pending.passives = std::move(passives);
    return;
  }
  if (!waiting.empty()) {
    const std::uint64_t now = monotonic_ns();
    if (!g.pending.active) {
      g.pending.active = true;
      g.pending.since_ns = now;
      VF_LOG_INFO(
          "srq {:#x}: its move to the {} path waits for the pairing of {} QP(s) on it "
          "(qp {}{}), at most {} ms",
          srq.app_srq->handle, path_name(target), waiting.size(), waiting[0]->qp->vqpn,
          waiting.size() > 1 ? ", ..." : "", kSrqPairingWaitNs / 1'000'000);
    }
    g.pending.target = target;
    g.pending.reason = reason;
    if (now - g.pending.since_ns < kSrqPairingWaitNs) {
      g.pending.passives = std::move(passives);
      return;
    }
    for (Protection* q : waiting) blocked.push_back(q);  // waited long enough
  }
  std::vector<Protection*> all = movers;
  all.insert(all.end(), blocked.begin(), blocked.end());
  if (reason != FailoverReason::kFailback) {
    // A member that cannot follow and whose own path works would starve (issue 19 item 2).
    const auto healthy = std::find_if(blocked.begin(), blocked.end(), [&](const Protection* q) {
      return !member_path_failed(*q, passive_of(q) != nullptr);
    });
    if (healthy != blocked.end()) {
      const std::uint32_t vqpn = (*healthy)->qp->vqpn;
      VF_LOG_WARN("srq {:#x}: stays on the {} path: qp {} on it works there and has no usable "
                  "{} path; the QPs on it whose connection failed get their errors",
                  srq.app_srq->handle, path_name(srq.active_path()), vqpn, path_name(target));
      return stay_put(e, g, all, passives,
                      fmt::format("its connection failed and its shared receive queue could not "
                                  "move (qp {} on it works and cannot follow)",
                                  vqpn));
    }
  }
  g.pending = {};
  const int from = srq.active_path();
  if (from != target && srq.may_hold_stale[target] && !sweep_srq(e, g, target)) {
    if (reason == FailoverReason::kFailback) {
      // Nothing moves; a peer that asked must not wait for an answer that will not come.
      for (const SrqGroup::PassiveMember& m : passives) answer_pair_ended(e, *m.q);
      return;
    }
    return stay_put(e, g, all, passives,
                    "its connection failed and its shared receive queue could not move (the "
                    "other path's SRQ could not be swept)");
  }
  srq.set_holding(true);
  for (Protection* q : blocked) {
    give_up_member(e, *q, "its shared receive queue moved without it (no usable standby path of "
                          "its own)");
  }
  // A member a switch cannot take (pass-through since srq_member_in_use looked) stays behind.
  std::erase_if(movers, [&](Protection* q) {
    if (const SrqGroup::PassiveMember* m = passive_of(q)) {
      return !begin_switch(e, *q, target,
                           reason == FailoverReason::kFailback ? reason
                                                               : FailoverReason::kPeerRequest,
                           m->epoch, false);
    }
    // Moved along with the QP whose peer asked: for its own peer, a request of ours.
    const bool along = !passives.empty() && reason != FailoverReason::kFailback;
    return !begin_switch(e, *q, target, along ? FailoverReason::kPeerRequest : reason,
                         q->epoch + 1, true);
  });
  // Every QP of the SRQ is off the old path and its completions are in: what the record still
  // holds was consumed by nobody.
  const int moved = srq.move_to(target);
  if (from != target) srq.may_hold_stale[from] = true;
  if (moved < 0) {
    VF_LOG_ERROR("srq {:#x}: not every receive could be posted on the {} SRQ", srq.app_srq->handle,
                 path_name(target));
  } else {
    VF_LOG_INFO("srq {:#x}: {} receive(s) moved {} -> {} with {} QP(s)", srq.app_srq->handle, moved,
                path_name(from), path_name(target), movers.size());
  }
  for (Protection* q : movers) {
    if (const SrqGroup::PassiveMember* m = passive_of(q)) {
      answer_failover(e, *q, m->delivered);
      continue;
    }
    ask_peer_to_switch(e, *q, reason);
  }
}

bool ensure_shadow_srq(Engine& e, SrqGroup& g, int backup_device) {
  VirtualSrq& srq = *g.srq;
  if (srq.shadow != nullptr) return srq.shadow_device_index == backup_device;
  ShadowPd* pd = shadow_pd_for(e, g.pd, backup_device);
  if (pd == nullptr) return false;
  ibv_srq_init_attr init{};
  init.attr.max_wr = srq.max_wr;
  init.attr.max_sge = srq.max_sge;
  ibv_srq* shadow = e.verbs.create_srq(pd->shadow, &init);
  if (shadow == nullptr) {
    VF_LOG_WARN("srq {:#x}: creating its shadow on {} failed ({})", srq.app_srq->handle,
                e.devices[backup_device].name, strerror(errno));
    return false;
  }
  srq.shadow = shadow;
  srq.shadow_device_index = backup_device;
  return true;
}

void pin_srq_group(Engine& e, SrqGroup& g, const std::string& why) {
  if (!g.pinned_reason.empty()) return;
  if (g.srq->active_path() != kPrimary) {
    VF_LOG_ERROR(
        "srq {:#x}: {} while its receives are on the standby SRQ; that QP gets none "
        "until they move back",
        g.srq->app_srq->handle, why);
    return;
  }
  g.pinned_reason = why;
  g.srq->pin_to_primary();
  g.pending = {};  // a move that waited for this pairing will not happen
  VF_LOG_WARN("srq {:#x}: unprotected from now on — {}", g.srq->app_srq->handle, why);
  for (VirtualQp* member : g.members) {
    auto it = e.protections.find(member);
    if (it == e.protections.end() || it->second.destroyed) continue;
    // A member whose path already failed (its move waited) gets the errors it would have got.
    if (!it->second.sw.in_progress &&
        (member->path[kPrimary].failed || member->link_error_seen.load())) {
      release_held_errors(it->second);
    }
    member->lock().lock();
    if (!it->second.sw.in_progress) member->set_mode(PostMode::kBypass);
    member->lock().unlock();
    it->second.pairing = false;
    it->second.paired = false;
    set_unprotected(it->second, fmt::format("its shared receive queue is unprotected ({})", why));
  }
}

void srq_created(Engine& e, ibv_srq* srq, ibv_pd* pd) {
  if (!engine_running(e) || srq == nullptr || e.srqs.count(srq) != 0) return;
  const int device = device_of_context(e, srq->context);
  if (device < 0 || e.devices[device].ports[1].backup_device < 0) {
    VF_LOG_INFO("srq {:#x}: not protected — its device has no backup", srq->handle);
    return;
  }
  ibv_srq_attr attr{};
  if (e.verbs.query_srq(srq, &attr) != 0) {
    VF_LOG_WARN("srq {:#x}: not protected — ibv_query_srq failed", srq->handle);
    return;
  }
  if (attr.max_sge > VirtualSrq::kMaxSge) {
    VF_LOG_WARN("srq {:#x}: not protected — {} SGEs per receive (the shim keeps up to {})",
                srq->handle, attr.max_sge, VirtualSrq::kMaxSge);
    return;
  }
  SrqGroup& g = e.srqs[srq];
  g.pd = pd;
  g.srq = std::make_unique<VirtualSrq>(srq, e.verbs.provider_ops(srq->context), attr.max_wr,
                                       attr.max_sge, device);
  datapath_registries::srqs_by_address.insert(srq, g.srq.get());
}

void srq_modified(Engine& e, ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  auto it = e.srqs.find(srq);
  if (it == e.srqs.end() || it->second.srq->shadow == nullptr || !(mask & IBV_SRQ_MAX_WR)) return;
  // The shadow must hold as many receives as the application's.
  ibv_srq_attr resize{};
  resize.max_wr = attr->max_wr;
  if (e.verbs.modify_srq(it->second.srq->shadow, &resize, IBV_SRQ_MAX_WR) != 0) {
    VF_LOG_WARN("srq {:#x}: resizing its shadow to {} failed", srq->handle, attr->max_wr);
  }
}

void srq_destroyed(Engine& e, ibv_srq* srq) {
  auto it = e.srqs.find(srq);
  if (it == e.srqs.end()) return;
  datapath_registries::srqs_by_address.erase(srq);
  if (it->second.srq->shadow != nullptr) e.verbs.destroy_srq(it->second.srq->shadow);
  // A poster that found the record before the erase is done with it once it lets go of it.
  it->second.srq->lock().lock();
  it->second.srq->lock().unlock();
  e.srqs.erase(it);
}

}  // namespace vf::failover
