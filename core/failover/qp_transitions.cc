#include "core/failover/qp_transitions.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

bool refresh_gid_index(Engine& e, Protection& p, int path, StepFailure& failure) {
  PhysicalPath& physical = p.qp->path[path];
  // Not known (the device did not say at the application's RTR): the index of before.
  if (gid_is_zero(physical.gid)) return true;
  const Device& device = e.devices[physical.device_index];
  const int index = gid_index_of(e, physical.device_index, physical.port, physical.gid,
                                 physical.gid_type, physical.gid_index);
  if (index < 0) {
    failure = {fmt::format("finding its own GID {} in the GID table of {}/{} (its address is "
                           "gone; the path waits until it is back)",
                           gid_text(physical.gid), device.name, physical.port),
               ENODATA};
    return false;
  }
  if (index != physical.gid_index) {
    VF_LOG_INFO("qp {}: the {} path's GID {} moved from index {} to {} on {}/{} (its address was "
                "added again); it is re-connected with the new index",
                p.qp->vqpn, path_name(path), gid_text(physical.gid), physical.gid_index, index,
                device.name, physical.port);
    physical.gid_index = index;
  }
  return true;
}

namespace {

// ECE options take effect at the QP's modify stages (ibv_set_ece(3)): set before RTR. 0 or errno.
int apply_ece(Engine& e, ibv_qp* qp, const ibv_ece& ece) {
  if (ece.vendor_id == 0) return 0;
  if (e.verbs.set_ece == nullptr) return EOPNOTSUPP;
  ibv_ece copy = ece;
  return e.verbs.set_ece(qp, &copy);
}

// Re-connects the application's own QP after a reset (RTR/RTS with the application's attributes
// and fresh PSNs; RTR only if the application never moved it to RTS).
bool connect_primary(Engine& e, Protection& p, std::uint32_t dest_qpn, std::uint32_t dest_psn,
                     StepFailure& failure) {
  VirtualQp& v = *p.qp;
  if (!p.attrs.have_rtr) {
    failure.step = "the application's RTR attributes are not known yet";
    return false;
  }
  if (p.primary_ece_read) {  // what the application set before its RTR, again after the reset
    if (const int result = apply_ece(e, v.app_qp, p.primary_ece); result != 0) {
      failure = {fmt::format("ECE options {:#x}", p.primary_ece.options), result};
      return false;
    }
  }
  if ((p.attrs.rtr_mask & IBV_QP_AV) && p.attrs.rtr.ah_attr.is_global) {
    if (!refresh_gid_index(e, p, kPrimary, failure)) return false;
    // Kept: the application's later moves and every re-connection use the index found.
    p.attrs.rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(v.path[kPrimary].gid_index);
  }
  ibv_qp_attr attr = p.attrs.rtr;
  attr.qp_state = IBV_QPS_RTR;
  attr.dest_qp_num = dest_qpn;
  attr.rq_psn = dest_psn;
  int mask = p.attrs.rtr_mask | IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (const int result = modify(e, v.app_qp, &attr, mask, true); result != 0) {
    const bool global = (mask & IBV_QP_AV) && attr.ah_attr.is_global;
    failure = {fmt::format("RTR to the peer's qp {} ({}, port {})", dest_qpn,
                           global ? fmt::format("dgid {}, sgid index {}",
                                                gid_text(gid_of(attr.ah_attr.grh.dgid)),
                                                attr.ah_attr.grh.sgid_index)
                                  : fmt::format("dlid {}", attr.ah_attr.dlid),
                           attr.ah_attr.port_num),
               result};
    return false;
  }
  // An application that only receives may leave its QP in RTR (perftest's server of a one-way
  // bandwidth test): the re-armed primary stays there too, as the application left it.
  if (!p.attrs.have_rts) return true;
  attr = p.attrs.rts;
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = v.path[kPrimary].psn;
  mask = p.attrs.rts_mask | IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (const int result = modify(e, v.app_qp, &attr, mask, true); result != 0) {
    failure = {"RTS", result};
    return false;
  }
  return true;
}

// The application's RNR timer, RNR retries and transport retries (as adjusted for it: at most
// kMaxRetryCount), where it gave them; the engine's defaults where it has not (yet).
void standby_retry_counts(const Protection& p, EngineQpLink& link) {
  const QpAttrs& given = p.attrs;
  if (given.have_rts && (given.rts_mask & IBV_QP_MIN_RNR_TIMER)) {
    link.min_rnr_timer = given.rts.min_rnr_timer;  // tuned in RTS: the latest
  } else if (given.have_rtr && (given.rtr_mask & IBV_QP_MIN_RNR_TIMER)) {
    link.min_rnr_timer = given.rtr.min_rnr_timer;
  }
  if (given.have_rts && (given.rts_mask & IBV_QP_RNR_RETRY)) link.rnr_retry = given.rts.rnr_retry;
  if (given.have_rts && (given.rts_mask & IBV_QP_RETRY_CNT)) {
    link.retry_cnt = std::min(given.rts.retry_cnt, kMaxRetryCount);
  }
}

}  // namespace

// The MTU this side offers for the standby pair: the backup port's, no larger than what the
// application gave its primary.
ibv_mtu standby_mtu(Engine& e, const Protection& p) {
  const PhysicalPath& standby = p.qp->path[kStandby];
  ibv_mtu mtu = e.devices[standby.device_index].ports[standby.port].active_mtu;
  if (p.attrs.have_rtr && (p.attrs.rtr_mask & IBV_QP_PATH_MTU))
    mtu = std::min(mtu, p.attrs.rtr.path_mtu);
  return mtu;
}

int modify(Engine& e, ibv_qp* qp, ibv_qp_attr* attr, int mask, bool app_qp) {
  if (!app_qp) return e.verbs.modify_qp(qp, attr, mask);
  const ibv_qp_state application_view = qp->state;
  auto known = e.physical_states.find(qp);
  if (known != e.physical_states.end()) qp->state = known->second;
  const ibv_qp_state before = qp->state;
  const int result = e.verbs.modify_qp(qp, attr, mask);
  e.physical_states[qp] = result == 0 && (mask & IBV_QP_STATE) ? attr->qp_state : before;
  qp->state = application_view;
  return result;
}

bool to_reset_and_init(Engine& e, ibv_qp* qp, std::uint8_t port, unsigned int access, bool app_qp,
                       StepFailure* failure) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  if (const int result = modify(e, qp, &attr, IBV_QP_STATE, app_qp); result != 0) {
    if (failure != nullptr) *failure = {"RESET", result};
    return false;
  }
  attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = port;
  attr.pkey_index = 0;
  attr.qp_access_flags = access;
  if (const int result = modify(
          e, qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, app_qp);
      result != 0) {
    if (failure != nullptr) *failure = {fmt::format("INIT on port {}", port), result};
    return false;
  }
  return true;
}

bool to_error(Engine& e, ibv_qp* qp, bool app_qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(e, qp, &attr, IBV_QP_STATE, app_qp) == 0;
}

int engine_qp_to_rtr(Engine& e, ibv_qp* qp, const EngineQpLink& link) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = link.mtu;
  attr.dest_qp_num = link.dest_qpn;
  attr.rq_psn = link.rq_psn;
  attr.max_dest_rd_atomic = link.rd_atomic;
  attr.min_rnr_timer = link.min_rnr_timer;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = to_ibv_gid(link.dest_gid);
  attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(link.sgid_index);
  attr.ah_attr.grh.hop_limit = 64;
  attr.ah_attr.port_num = link.port;
  return e.verbs.modify_qp(qp, &attr,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int engine_qp_to_rts(Engine& e, ibv_qp* qp, const EngineQpLink& link) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = link.sq_psn;
  attr.timeout = link.timeout;
  attr.retry_cnt = link.retry_cnt;
  attr.rnr_retry = link.rnr_retry;
  attr.max_rd_atomic = link.rd_atomic;
  // min_rnr_timer again (optional in RTR -> RTS): a standby that waited in RTR takes the one
  // the application gave with its RTS.
  attr.min_rnr_timer = link.min_rnr_timer;
  return e.verbs.modify_qp(qp, &attr,
                           IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                               IBV_QP_MIN_RNR_TIMER);
}

int connect_engine_qp(Engine& e, ibv_qp* qp, const EngineQpLink& link, const char** step) {
  *step = "RTR";
  if (const int result = engine_qp_to_rtr(e, qp, link); result != 0) return result;
  *step = "RTS";
  return engine_qp_to_rts(e, qp, link);
}

const ibv_ece& primary_ece(Engine& e, Protection& p) {
  if (!p.primary_ece_read) {
    p.primary_ece_read = true;
    p.primary_ece = {};
    if (e.verbs.query_ece == nullptr || e.verbs.query_ece(p.qp->app_qp, &p.primary_ece) != 0) {
      p.primary_ece = {};
    }
  }
  return p.primary_ece;
}

ibv_ece agree_ece(const ibv_ece& mine, const PairRequest& theirs) {
  if (mine.vendor_id == 0 || mine.vendor_id != theirs.ece_vendor_id) return {};
  ibv_ece agreed{};
  agreed.vendor_id = mine.vendor_id;
  agreed.options = mine.options & theirs.ece_options;
  return agreed;
}

bool connect_standby(Engine& e, Protection& p, std::uint32_t dest_qpn, const Gid& dest_gid,
                     std::uint32_t dest_psn, std::uint8_t peer_mtu) {
  PhysicalPath& standby = p.qp->path[kStandby];
  // A probe in flight dies with the QP's reset (mlx5 even purges its completion), and the peer's
  // end may connect only when our answer reaches it: no probe until it has had time to
  // (path_probe.h).
  p.probe.in_flight = 0;
  p.probe.quiet_until_ns = monotonic_ns() + kProbeQuietAfterConnectNs;
  const Device& device = e.devices[standby.device_index];
  EngineQpLink link;
  link.mtu = standby_mtu(e, p);
  if (peer_mtu != 0) link.mtu = std::min(link.mtu, static_cast<ibv_mtu>(peer_mtu));
  link.dest_qpn = dest_qpn;
  link.rq_psn = dest_psn;
  link.sq_psn = standby.psn;
  link.dest_gid = dest_gid;
  if (StepFailure failure; !refresh_gid_index(e, p, kStandby, failure)) {
    VF_LOG_WARN("qp {}: standby qp {} cannot connect: {}", p.qp->vqpn, standby.qp->qp_num,
                failure.text());
    return false;
  }
  link.sgid_index = standby.gid_index;
  link.port = standby.port;
  link.rd_atomic =
      static_cast<std::uint8_t>(std::min<int>(kStandbyRdAtomic, device.max_qp_rd_atom));
  link.timeout = e.config.qp_timeout;
  standby_retry_counts(p, link);
  if (const int result = apply_ece(e, standby.qp, p.standby_ece); result != 0) {
    VF_LOG_WARN(
        "qp {}: standby qp {} refused ECE options {:#x} of vendor {:#x}, which its primary "
        "and the peer's run with ({})",
        p.qp->vqpn, standby.qp->qp_num, p.standby_ece.options, p.standby_ece.vendor_id,
        strerror(result));
    return false;
  }
  const char* step = "RTR";
  p.standby_rts_pending = !p.attrs.have_rts;
  const int result = p.standby_rts_pending ? engine_qp_to_rtr(e, standby.qp, link)
                                           : connect_engine_qp(e, standby.qp, link, &step);
  if (result != 0) {
    VF_LOG_WARN("qp {}: standby qp {} to {} failed ({})", p.qp->vqpn, standby.qp->qp_num, step,
                strerror(result));
    return false;
  }
  if (p.standby_rts_pending) {
    VF_LOG_DEBUG("qp {}: standby qp {} waits in RTR for the application's RTS (its RNR retries)",
                 p.qp->vqpn, standby.qp->qp_num);
  }
  return true;
}

int standby_follow_rts(Engine& e, Protection& p, const ibv_qp_attr& asked, int mask) {
  PhysicalPath& standby = p.qp->path[kStandby];
  if (!p.paired || standby.qp == nullptr) return 0;
  // A standby that carries the traffic is tried whatever its flags say (a port that blinked, an
  // earlier refusal): left in RTR it would take requests and send none.
  const bool carries = p.qp->active_path() == kStandby;
  if (!carries && (!standby.connected || standby.failed)) return 0;
  const char* what = "";
  int result = 0;
  if (p.standby_rts_pending && (mask & IBV_QP_STATE) && asked.qp_state == IBV_QPS_RTS) {
    EngineQpLink link;
    link.sq_psn = standby.psn;
    link.rd_atomic = static_cast<std::uint8_t>(
        std::min<int>(kStandbyRdAtomic, e.devices[standby.device_index].max_qp_rd_atom));
    link.timeout = e.config.qp_timeout;
    standby_retry_counts(p, link);
    what = "RTS";
    result = engine_qp_to_rts(e, standby.qp, link);
    if (result == 0) p.standby_rts_pending = false;
  } else if (!p.standby_rts_pending && (mask & IBV_QP_MIN_RNR_TIMER) &&
             !((mask & IBV_QP_STATE) && asked.qp_state != IBV_QPS_RTS) &&
             !(p.sw.in_progress && p.sw.from == kStandby)) {
    // (A standby being switched away from is going to ERR: it keeps its timer; a re-connection
    // takes the one recorded.)
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.min_rnr_timer = asked.min_rnr_timer;
    what = "its min_rnr_timer";
    result = e.verbs.modify_qp(standby.qp, &attr, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER);
  }
  if (result != 0) {
    VF_LOG_WARN("qp {}: standby qp {} refused {} after the application's ({})", p.qp->vqpn,
                standby.qp->qp_num, what, strerror(result));
  }
  return result;
}

std::uint32_t random_psn() {
  static thread_local std::mt19937 generator{std::random_device{}()};
  return generator() & 0xffffff;
}

bool reset_path(Engine& e, Protection& p, int path, StepFailure* failure) {
  if (path == kStandby) p.probe.in_flight = 0;  // it dies with the reset, with no completion
  PhysicalPath& physical = p.qp->path[path];
  const unsigned int access = path == kPrimary && (p.attrs.init_mask & IBV_QP_ACCESS_FLAGS)
                                  ? p.attrs.init.qp_access_flags
                                  : kFullAccess;
  return to_reset_and_init(e, physical.qp, physical.port, access, path == kPrimary, failure);
}

bool connect_path(Engine& e, Protection& p, int path, std::uint32_t qpn, const Gid& gid,
                  std::uint32_t psn, StepFailure* failure) {
  StepFailure ignored;
  StepFailure& out = failure != nullptr ? *failure : ignored;
  if (path == kPrimary) return connect_primary(e, p, qpn, psn, out);
  if (connect_standby(e, p, qpn, gid, psn, p.peer_mtu)) return true;
  out = {"connecting the standby (the line before says which step)", 0};
  return false;
}

std::string StepFailure::text() const {
  return error == 0 ? step : fmt::format("{} ({})", step, strerror(error));
}

}  // namespace vf::failover
