#include "core/failover/qp_lifecycle.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <string>

#include "core/clock.h"
#include "core/failover/cq_shadows.h"
#include "core/failover/devices.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/pairing.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_wait.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/failover/srq_group.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

void qp_created(Engine& e, ibv_qp* qp, const ibv_qp_init_attr_ex& attr) {
  if (!engine_running(e) || qp == nullptr) return;
  SrqGroup* group = nullptr;
  if (attr.srq != nullptr) {
    auto it = e.srqs.find(attr.srq);
    if (it != e.srqs.end()) group = &it->second;
  }
  auto pass_through = [&](std::string reason, bool info) {
    if (group != nullptr)
      pin_srq_group(e, *group, fmt::format("qp {} on it {}", qp->qp_num, reason));
    if (info) {
      VF_LOG_INFO("qp {}: not protected — {}", qp->qp_num, reason);
    } else {
      VF_LOG_WARN("qp {}: unprotected — {}", qp->qp_num, reason);
    }
    e.unprotected.emplace_back(qp->qp_num, std::move(reason));
  };
  if (attr.qp_type != IBV_QPT_RC) {
    return pass_through(fmt::format("type {} passes through (only RC QPs are protected)",
                                    static_cast<int>(attr.qp_type)),
                        true);
  }
  if (attr.srq != nullptr && group == nullptr) {
    return pass_through("its shared receive queue is not protected (see the SRQ's log line)",
                        false);
  }
  if (group != nullptr && !group->pinned_reason.empty()) {
    return pass_through(
        fmt::format("its shared receive queue is not protected: {}", group->pinned_reason), false);
  }
  const int device = device_of_context(e, qp->context);
  if (device < 0) return pass_through("its device is unknown to the engine", false);
  const Device& d = e.devices[device];
  const int backup = d.ports[1].backup_device;
  if (backup < 0) return pass_through(fmt::format("{} has no backup device", d.name), false);
  auto send_it = e.cqs.find(attr.send_cq);
  auto recv_it = e.cqs.find(attr.recv_cq);
  if (send_it == e.cqs.end() || recv_it == e.cqs.end()) {
    return pass_through("its CQ was created before the shim's engine started", false);
  }
  CqState* send_cq = send_it->second.get();
  CqState* recv_cq = recv_it->second.get();
  if (!ensure_shadow(e, *send_cq, backup) || !ensure_shadow(e, *recv_cq, backup)) {
    return pass_through("no shadow CQ on the backup device", false);
  }
  if (send_cq->shadow_failed || recv_cq->shadow_failed) {
    return pass_through("its CQ's shadow on the backup device overran and is lost", false);
  }
  ShadowPd* pd = shadow_pd_for(e, attr.pd, backup);
  if (pd == nullptr) return pass_through("no shadow PD on the backup device", false);
  // The provider may have raised the capabilities: the ring must hold what the QP can.
  ibv_qp_init_attr actual{};
  ibv_qp_attr ignored{};
  ibv_qp_cap cap = attr.cap;
  if (e.verbs.query_qp(qp, &ignored, IBV_QP_CAP, &actual) == 0) cap = actual.cap;
  ibv_qp_init_attr standby_attr{};
  standby_attr.send_cq = send_cq->shadow;
  standby_attr.recv_cq = recv_cq->shadow;
  standby_attr.qp_type = IBV_QPT_RC;
  standby_attr.sq_sig_all = attr.sq_sig_all;
  standby_attr.cap = cap;
  if (group != nullptr) {
    if (!ensure_shadow_srq(e, *group, backup)) {
      return pass_through("no shadow of its shared receive queue on the backup device", false);
    }
    standby_attr.srq = group->srq->shadow;
    standby_attr.cap.max_recv_wr = 0;
    standby_attr.cap.max_recv_sge = 0;
  }
  standby_attr.cap.max_send_wr = cap.max_send_wr + kProbeSendSlots;
  ibv_qp* standby = e.verbs.create_qp(pd->shadow, &standby_attr);
  const bool probe_slot = standby != nullptr;
  if (standby == nullptr) {
    // The device's limit: the standby as the application's QP, and no probes for it.
    standby_attr.cap.max_send_wr = cap.max_send_wr;
    standby = e.verbs.create_qp(pd->shadow, &standby_attr);
  }
  if (standby == nullptr) {
    return pass_through(fmt::format("creating its standby QP on {} failed ({})",
                                    e.devices[backup].name, strerror(errno)),
                        false);
  }
  auto virtual_qp = std::make_unique<VirtualQp>(qp, e.verbs.provider_ops(qp->context), cap,
                                                attr.sq_sig_all != 0, send_cq, recv_cq);
  VirtualQp* v = virtual_qp.get();
  v->path[kPrimary].qp = qp;
  v->path[kPrimary].device_index = device;
  v->path[kPrimary].port = 1;
  v->path[kStandby].qp = standby;
  v->path[kStandby].device_index = backup;
  v->path[kStandby].port = d.ports[1].backup_port;
  v->path[kStandby].gid_index = standby_gid_index(e, backup, v->path[kStandby].port,
                                                  &v->path[kStandby].gid,
                                                  &v->path[kStandby].gid_type);
  v->path[kStandby].psn = random_psn();
  if (!to_reset_and_init(e, standby, v->path[kStandby].port, kFullAccess, false)) {
    e.verbs.destroy_qp(standby);
    return pass_through("its standby QP does not reach INIT", false);
  }
  if (group != nullptr) {
    v->srq = group->srq.get();
    group->members.push_back(v);
  } else {
    // Its drain marker (a receive: none on an SRQ) may land in the shadow on top of the
    // application's completions; given back when the QP is destroyed.
    reserve_shadow_entries(e, *recv_cq, 1);
  }
  // The probe's completion may sit in the shadow on top of the application's: without room for
  // it there (the device's limit) the standby is not probed, lest the shadow overrun.
  bool probe_room = probe_slot;
  if (probe_slot && !reserve_shadow_entries(e, *send_cq, kProbeSendSlots)) {
    send_cq->shim_entries -= kProbeSendSlots;
    probe_room = false;
  }
  Protection& p = e.protections[v];
  p.qp = std::move(virtual_qp);
  p.probe.slot_reserved = probe_room;
  p.probe.disabled = !probe_room;
  if (!probe_room) {
    VF_LOG_INFO("qp {}: its standby is not probed (no {} for the probe on {}: the device's "
                "limit); a dead standby is found only when a failover needs it",
                qp->qp_num, probe_slot ? "CQ entry" : "send-queue slot", e.devices[backup].name);
  }
  p.app_pd = attr.pd;
  p.unprotected_reason = "not paired yet (the application has not connected it)";
  datapath_registries::qps_by_qpn.insert(qpn_registry_key(device, qp->qp_num), v);
  datapath_registries::qps_by_qpn.insert(qpn_registry_key(backup, standby->qp_num), v);
  datapath_registries::qps_by_address.insert(qp, v);
  VF_LOG_DEBUG("qp {}: standby qp {} created on {}/{}", qp->qp_num, standby->qp_num,
               e.devices[backup].name, v->path[kStandby].port);
}

namespace {

// What one modify of the application's gives for a state, merged into what it gave for that state
// before: an attribute the modify names replaces the kept one, the others stay. An RTS -> RTS
// modify of min_rnr_timer alone must not make the shim forget the send PSN, timeout and retry
// counts that re-connecting the primary needs (it would fail with EINVAL: no failback).
// IBV_QP_CUR_STATE is not kept: it asserts the state the QP was in at that call, not the one a
// re-connection starts from.
void merge_attrs(ibv_qp_attr& kept, int& kept_mask, const ibv_qp_attr& attr, int mask) {
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) kept.en_sqd_async_notify = attr.en_sqd_async_notify;
  if (mask & IBV_QP_ACCESS_FLAGS) kept.qp_access_flags = attr.qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) kept.pkey_index = attr.pkey_index;
  if (mask & IBV_QP_PORT) kept.port_num = attr.port_num;
  if (mask & IBV_QP_QKEY) kept.qkey = attr.qkey;
  if (mask & IBV_QP_AV) kept.ah_attr = attr.ah_attr;
  if (mask & IBV_QP_PATH_MTU) kept.path_mtu = attr.path_mtu;
  if (mask & IBV_QP_TIMEOUT) kept.timeout = attr.timeout;
  if (mask & IBV_QP_RETRY_CNT) kept.retry_cnt = attr.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) kept.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_RQ_PSN) kept.rq_psn = attr.rq_psn;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) kept.max_rd_atomic = attr.max_rd_atomic;
  if (mask & IBV_QP_ALT_PATH) {
    kept.alt_ah_attr = attr.alt_ah_attr;
    kept.alt_pkey_index = attr.alt_pkey_index;
    kept.alt_port_num = attr.alt_port_num;
    kept.alt_timeout = attr.alt_timeout;
  }
  if (mask & IBV_QP_MIN_RNR_TIMER) kept.min_rnr_timer = attr.min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) kept.sq_psn = attr.sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) kept.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (mask & IBV_QP_PATH_MIG_STATE) kept.path_mig_state = attr.path_mig_state;
  if (mask & IBV_QP_CAP) kept.cap = attr.cap;
  if (mask & IBV_QP_DEST_QPN) kept.dest_qp_num = attr.dest_qp_num;
  if (mask & IBV_QP_RATE_LIMIT) kept.rate_limit = attr.rate_limit;
  kept_mask |= mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
}

// The application's RTS attributes, kept to re-connect its QP after a re-arm.
void record_rts(Protection& p, const ibv_qp_attr& adjusted, int mask, const ibv_qp_attr& asked) {
  merge_attrs(p.attrs.rts, p.attrs.rts_mask, adjusted, mask);
  p.attrs.have_rts = true;
  if (mask & IBV_QP_SQ_PSN) p.qp->path[kPrimary].psn = asked.sq_psn;
}

// The standby follows the application's RTS (its retry counts) and RNR timer. Returns the
// provider's errno when the QP's traffic already runs on a standby that cannot leave RTR (the
// peer moved the pair before this RTS): no path can carry the application's requests, so its RTS
// fails, and fails again on each retry for as long as the standby refuses. A standby that does
// not carry the traffic and refuses is out of use: the peer is told (it must not switch there)
// and a re-arm connects it again from the start (RTR and RTS at once, the RTS now known).
int follow_rts_on_standby(Engine& e, Protection& p, const ibv_qp_attr& adjusted, int mask) {
  const bool was_pending = p.standby_rts_pending;
  const int result = standby_follow_rts(e, p, adjusted, mask);
  if (result == 0 || !was_pending) return 0;
  VirtualQp& v = *p.qp;
  if (v.active_path() == kStandby) {
    set_unprotected(p, "its standby QP, which carries its traffic, could not follow the "
                       "application's RTS");
    return result;
  }
  v.path[kStandby].connected = false;
  p.standby_rts_pending = false;  // the re-arm's connection is complete
  p.rearm[kStandby].needed = true;
  send_path_status(e, p, kStandby, false);
  set_unprotected(p, "its standby QP could not follow the application's RTS");
  return 0;
}

}  // namespace

int modify_app_qp(Engine& e, VirtualQp* v, ibv_qp* qp, ibv_qp_attr* attr, int mask,
                  int (*real)(ibv_qp*, ibv_qp_attr*, int)) {
  auto it = e.protections.find(v);
  if (it == e.protections.end()) return real(qp, attr, mask);
  Protection& p = it->second;
  ibv_qp_attr adjusted = *attr;
  if ((mask & IBV_QP_TIMEOUT) &&
      (adjusted.timeout == 0 || adjusted.timeout > e.config.qp_timeout)) {
    VF_LOG_DEBUG("qp {}: transport timeout {} -> {} (VERBS_FAILOVER_QP_TIMEOUT)", qp->qp_num,
                 adjusted.timeout, e.config.qp_timeout);
    adjusted.timeout = e.config.qp_timeout;
  }
  if ((mask & IBV_QP_RETRY_CNT) && adjusted.retry_cnt > kMaxRetryCount) {
    VF_LOG_DEBUG("qp {}: retry count {} -> {} (a provider may take 7 as without end)", qp->qp_num,
                 adjusted.retry_cnt, kMaxRetryCount);
    adjusted.retry_cnt = kMaxRetryCount;
  }
  if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && !v->application_failed.load() &&
      (p.sw.in_progress || v->active_path() != kPrimary)) {
    // The peer switched the pair between the application's RTR and its RTS: the QP it drives
    // is in ERR under the engine's hands and its traffic runs on the standby. Its RTS is what a
    // re-arm will reconnect it with; for the application it succeeds, as it would have.
    VF_LOG_DEBUG("qp {}: RTS recorded (its traffic is on the {} path)", qp->qp_num,
                 path_name(v->active_path()));
    record_rts(p, adjusted, mask, *attr);
    if (const int refused = follow_rts_on_standby(e, p, adjusted, mask); refused != 0) {
      return refused;
    }
    qp->state = IBV_QPS_RTS;
    return 0;
  }
  const int result = real(qp, &adjusted, mask);
  if (result != 0 || !(mask & IBV_QP_STATE)) return result;
  switch (attr->qp_state) {
    case IBV_QPS_INIT:
      merge_attrs(p.attrs.init, p.attrs.init_mask, adjusted, mask);
      p.attrs.have_init = true;
      if (mask & IBV_QP_PORT) v->path[kPrimary].port = attr->port_num;
      break;
    case IBV_QPS_RTR: {
      merge_attrs(p.attrs.rtr, p.attrs.rtr_mask, adjusted, mask);
      p.attrs.have_rtr = true;
      ibv_gid gid{};
      const int gid_index =
          (mask & IBV_QP_AV) && attr->ah_attr.is_global ? attr->ah_attr.grh.sgid_index : 0;
      if (e.verbs.query_gid(e.devices[v->path[kPrimary].device_index].context,
                            v->path[kPrimary].port, gid_index, &gid) == 0) {
        v->path[kPrimary].gid = gid_of(gid);
        v->path[kPrimary].gid_index = gid_index;
        // Its type too: a re-arm after the GID moved looks for the same address of the same
        // type (RoCE v1 and v2 entries share the value).
        v->path[kPrimary].gid_type =
            gid_type_at(e, v->path[kPrimary].device_index, v->path[kPrimary].port, gid_index);
      }
      p.local = QpKey{qp->qp_num, v->path[kPrimary].gid};
      if (mask & IBV_QP_DEST_QPN) {
        p.remote = QpKey{attr->dest_qp_num, (mask & IBV_QP_AV) && attr->ah_attr.is_global
                                                ? gid_of(attr->ah_attr.grh.dgid)
                                                : Gid{}};
        p.remote_known = true;
      }
      if (mask & IBV_QP_RQ_PSN) {
        // nothing: the application's PSNs stay its own until a re-arm picks fresh ones
      }
      // A peer in this process pairs at once (no network); any other pairing connects to the
      // peer, which may block: the engine's thread does it.
      // A QP failed for good and reset for re-use by its application is not paired again.
      if (!p.paired && !p.pairing && p.remote_known && !p.ended &&
          !v->application_failed.load() && !pair_locally(e, p)) {
        p.start_pairing_pending = true;
      }
      wake_engine(e);
      break;
    }
    case IBV_QPS_RTS:
      record_rts(p, adjusted, mask, *attr);
      follow_rts_on_standby(e, p, adjusted, mask);
      break;
    case IBV_QPS_ERR:
    case IBV_QPS_RESET:
    case IBV_QPS_SQD:
    case IBV_QPS_SQE:
      // The application tears the QP down (or drives it itself): it gets what it asks for. If
      // its traffic runs on the standby, that QP goes to ERR as well, and its flushes reach the
      // application (translated) as the primary's would have.
      if (p.path_wait.active && attr->qp_state == IBV_QPS_RESET) {
        // A reset ends the QP's work without completions: what the wait held (errors, posts) is
        // dropped with it.
        // Under one lock with the move to pass-through: a post racing it must not send what the
        // wait held (those requests are dropped from the ring's view: nothing is posted again).
        p.path_wait = PathWait{};
        v->lock().lock();
        v->drop_held_errors();
        v->restart_sends(v->send_ring().next_sequence());
        v->set_mode(PostMode::kBypass);
        v->set_holding(false);
        v->lock().unlock();
      } else if (p.path_wait.active) {
        // Its errors and the flushes of what the wait held come first, before anything the
        // application posts after this modify.
        v->application_failed.store(true);
        end_path_wait(e, p, "the application moved its QP out of RTS while it waited for a path");
      }
      v->application_failed.store(true);
      if (attr->qp_state == IBV_QPS_RESET && !p.sw.in_progress) {
        // A reset ends all the QP's work without completions and makes it new (an application
        // may re-use a failed QP so): from now on it is the application's own QP, pass-through,
        // whatever path its traffic ran on.
        if (v->active_path() == kStandby && v->path[kStandby].qp != nullptr) {
          to_error(e, v->path[kStandby].qp, false);
        }
        v->lock().lock();
        v->set_accepting(kStandby, false);
        v->set_active_path(kPrimary);
        v->set_accepting(kPrimary, true);
        v->set_mode(PostMode::kBypass);
        v->lock().unlock();
      } else if (v->active_path() == kStandby && v->path[kStandby].qp != nullptr) {
        to_error(e, v->path[kStandby].qp, false);
      } else if (!p.sw.in_progress) {
        v->lock().lock();
        v->set_mode(PostMode::kBypass);
        v->lock().unlock();
      }
      p.pairing = false;
      p.start_pairing_pending = false;
      p.rearm[0] = {};
      p.rearm[1] = {};
      break;
    default:
      break;
  }
  return result;
}

void qp_queried(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_state application_view) {
  VirtualQp* v = find_virtual_qp(qp);
  // Pass-through for good (never paired, given up, or reset by the application after a failure):
  // the physical state is the application's business, as without the shim.
  if (v == nullptr || attr == nullptr || v->mode() == PostMode::kBypass) return;
  // Failed for good with its traffic routed (§5g): in ERR, as the application's QP would be,
  // whatever its primary's physical state (reset for a re-arm that will not come).
  const ibv_qp_state view = v->application_failed.load() ? IBV_QPS_ERR : application_view;
  qp->state = view;
  if (mask & IBV_QP_STATE) {
    attr->qp_state = view;
    attr->cur_qp_state = view;
  }
}

void qp_destroying(Engine& e, ibv_qp* qp) {
  VirtualQp* v = find_virtual_qp(qp);
  if (v == nullptr) return;
  auto it = e.protections.find(v);
  if (it == e.protections.end()) return;
  if (SrqGroup* group = group_of(e, *v)) std::erase(group->members, v);
  datapath_registries::qps_by_address.erase(qp);
  datapath_registries::qps_by_qpn.erase(
      qpn_registry_key(v->path[kPrimary].device_index, qp->qp_num));
  if (v->path[kStandby].qp != nullptr) {
    datapath_registries::qps_by_qpn.erase(
        qpn_registry_key(v->path[kStandby].device_index, v->path[kStandby].qp->qp_num));
  }
  // A poller that found the record before the erase is done with it once it lets go of the CQ.
  v->send_cq->lock.lock();
  v->send_cq->lock.unlock();
  v->recv_cq->lock.lock();
  v->recv_cq->lock.unlock();
  if (v->path[kStandby].qp != nullptr) e.verbs.destroy_qp(v->path[kStandby].qp);
  if (v->srq == nullptr && v->recv_cq->shim_entries > 0) --v->recv_cq->shim_entries;
  if (it->second.probe.slot_reserved && v->send_cq->shim_entries >= kProbeSendSlots) {
    v->send_cq->shim_entries -= kProbeSendSlots;
  }
  e.physical_states.erase(qp);
  // Keep the stats of a QP that existed (the file reports every QP of the run).
  Protection& p = it->second;
  p.destroyed = true;
  p.qp->path[kStandby].qp = nullptr;
  p.pairing = false;
  p.sw.in_progress = false;
  p.rearm[0] = {};
  p.rearm[1] = {};
  p.local = QpKey{};  // no longer matches a peer's message
}

}  // namespace vf::failover
