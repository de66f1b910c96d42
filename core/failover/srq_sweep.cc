#include "core/failover/srq_sweep.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/failover/qp_transitions.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

bool sweep_srq(Engine& e, SrqGroup& g, int path) {
  VirtualSrq& srq = *g.srq;
  ibv_srq* target = path == kPrimary ? srq.app_srq : srq.shadow;
  const int device = path == kPrimary ? srq.device_index : srq.shadow_device_index;
  if (target == nullptr || device < 0 || g.members.empty()) return false;
  const std::uint8_t port = g.members.front()->path[path].port;
  ibv_pd* pd = target->pd;
  ibv_context* context = target->context;
  const ibv_context_ops* ops = e.verbs.provider_ops(context);
  ibv_cq* cq = e.verbs.create_cq(context, 64, nullptr, nullptr, 0);
  if (cq == nullptr) return false;
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* sender = e.verbs.create_qp(pd, &init);
  init.srq = target;
  init.cap.max_recv_wr = 0;
  init.cap.max_recv_sge = 0;
  ibv_qp* receiver = sender != nullptr ? e.verbs.create_qp(pd, &init) : nullptr;
  Gid gid{};
  const int gid_index = standby_gid_index(e, device, port, &gid);
  auto connect = [&](ibv_qp* qp, std::uint32_t dest) {
    if (!to_reset_and_init(e, qp, port, kFullAccess, false)) return false;
    EngineQpLink link;
    link.dest_qpn = dest;
    link.dest_gid = gid;
    link.sgid_index = gid_index;
    link.port = port;
    link.timeout = 10;
    link.rnr_retry = 0;  // the first RNR ends the sweep: the SRQ is empty
    const char* step = "";
    return connect_engine_qp(e, qp, link, &step) == 0;
  };
  bool empty = false;
  std::uint64_t swept = 0;
  const char* failure = "its loopback QPs could not be created or connected";
  if (receiver != nullptr && connect(sender, receiver->qp_num) &&
      connect(receiver, sender->qp_num)) {
    failure = nullptr;
    const std::uint64_t deadline = monotonic_ns() + kSweepTimeoutNs;
    const std::uint64_t bound = static_cast<std::uint64_t>(srq.max_wr) * VirtualSrq::kSlack + 64;
    while (!empty && failure == nullptr && swept <= bound) {
      constexpr int kBatch = 16;
      int posted = 0;
      for (; posted < kBatch; ++posted) {
        ibv_send_wr wr{};
        ibv_send_wr* bad = nullptr;
        wr.wr_id = static_cast<std::uint64_t>(posted);
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        if (ops->post_send(sender, &wr, &bad) != 0) break;
      }
      if (posted == 0) {
        failure = "posting to its loopback QP failed";
        break;
      }
      int completed = 0;
      while (completed < posted && failure == nullptr) {
        ibv_wc wc[16];
        const int n = ops->poll_cq(cq, 16, wc);
        if (n < 0) failure = "polling its loopback CQ failed";
        for (int i = 0; i < n; ++i) {
          if (wc[i].qp_num != sender->qp_num) continue;  // a swept receive: nobody's now
          ++completed;
          if (wc[i].status == IBV_WC_SUCCESS) {
            ++swept;
          } else if (wc[i].status == IBV_WC_RNR_RETRY_EXC_ERR) {
            empty = true;
          } else if (!empty && wc[i].status != IBV_WC_WR_FLUSH_ERR) {
            failure = "its loopback send failed";
          }
        }
        if (monotonic_ns() > deadline) failure = "it did not finish within 2 s";
      }
    }
    if (!empty && failure == nullptr) failure = "it held more receives than it can";
  }
  if (receiver != nullptr) e.verbs.destroy_qp(receiver);
  if (sender != nullptr) e.verbs.destroy_qp(sender);
  e.verbs.destroy_cq(cq);
  if (failure != nullptr) {
    VF_LOG_ERROR("srq {:#x}: sweeping the {} SRQ failed ({}); receives are not moved there",
                 srq.app_srq->handle, path_name(path), failure);
    return false;
  }
  srq.may_hold_stale[path] = false;
  VF_LOG_INFO("srq {:#x}: swept {} receive(s) left on the {} SRQ by an earlier move",
              srq.app_srq->handle, swept, path_name(path));
  return true;
}

}  // namespace vf::failover
