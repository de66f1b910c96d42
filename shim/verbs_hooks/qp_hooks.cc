// Queue pairs: creation (classic and extended), state changes, ECE, and the posting functions.
#include <infiniband/verbs.h>

#include <mutex>

#include "core/datapath_registries.h"
#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/object_records.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"

using vf::shim::describe_context;
using vf::shim::describe_qp;
using vf::shim::intercept;
using vf::shim::real_verbs;

namespace {

std::string describe_init_attr(const ibv_qp_init_attr* attr) {
  if (attr == nullptr) return "attr=NULL";
  return fmt::format("type={} send_cq={} recv_cq={} srq={} max_send_wr={} max_recv_wr={} "
                     "max_send_sge={} max_recv_sge={} max_inline={} sq_sig_all={}",
                     static_cast<int>(attr->qp_type), fmt::ptr(attr->send_cq),
                     fmt::ptr(attr->recv_cq), fmt::ptr(attr->srq), attr->cap.max_send_wr,
                     attr->cap.max_recv_wr, attr->cap.max_send_sge, attr->cap.max_recv_sge,
                     attr->cap.max_inline_data, attr->sq_sig_all);
}

std::string describe_modify(const ibv_qp_attr* attr, int mask) {
  if (attr == nullptr) return "attr=NULL";
  std::string out = fmt::format("mask={:#x}", mask);
  if (mask & IBV_QP_STATE) out += fmt::format(" state={}", static_cast<int>(attr->qp_state));
  if (mask & IBV_QP_PATH_MTU) out += fmt::format(" mtu={}", static_cast<int>(attr->path_mtu));
  if (mask & IBV_QP_DEST_QPN) out += fmt::format(" dest_qpn={}", attr->dest_qp_num);
  if (mask & IBV_QP_RQ_PSN) out += fmt::format(" rq_psn={}", attr->rq_psn);
  if (mask & IBV_QP_SQ_PSN) out += fmt::format(" sq_psn={}", attr->sq_psn);
  if (mask & IBV_QP_TIMEOUT) out += fmt::format(" timeout={}", attr->timeout);
  if (mask & IBV_QP_RETRY_CNT) out += fmt::format(" retry_cnt={}", attr->retry_cnt);
  if (mask & IBV_QP_RNR_RETRY) out += fmt::format(" rnr_retry={}", attr->rnr_retry);
  if (mask & IBV_QP_AV) {
    out += fmt::format(" port={} gid_index={} is_global={}", attr->ah_attr.port_num,
                       attr->ah_attr.grh.sgid_index, attr->ah_attr.is_global);
  }
  return out;
}

}  // namespace

VF_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  // A classic QP has no ibv_wr_* API (only IBV_QP_INIT_ATTR_SEND_OPS_FLAGS asks for one), and
  // many providers (bnxt_re, irdma, siw...) allocate a bare ibv_qp, so it is never looked at as
  // an ibv_qp_ex.
  return intercept("ibv_create_qp", VF_ARGS("pd={} {}", fmt::ptr(pd), describe_init_attr(attr)),
                   [&] {
                     ibv_qp* qp = real_verbs().ibv_create_qp(pd, attr);
                     if (qp != nullptr && vf::shim::shim_active()) {
                       ibv_qp_init_attr_ex ex{};
                       ex.qp_context = attr->qp_context;
                       ex.send_cq = attr->send_cq;
                       ex.recv_cq = attr->recv_cq;
                       ex.srq = attr->srq;
                       ex.cap = attr->cap;
                       ex.qp_type = attr->qp_type;
                       ex.sq_sig_all = attr->sq_sig_all;
                       ex.pd = pd;
                       vf::FailoverEngine::instance().on_qp_created(qp, ex);
                     }
                     return qp;
                   });
}

VF_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  return intercept("ibv_modify_qp", VF_ARGS("{} {}", describe_qp(qp), describe_modify(attr, mask)),
                   [&] {
                     if (!vf::shim::shim_active()) return real_verbs().ibv_modify_qp(qp, attr, mask);
                     return vf::FailoverEngine::instance().modify_qp(qp, attr, mask,
                                                                     real_verbs().ibv_modify_qp);
                   });
}

VF_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) {
  return intercept("ibv_query_qp", VF_ARGS("{} mask={:#x}", describe_qp(qp), mask),
                   [&] {
                     // libibverbs writes the provider's (physical) state into qp->state: the
                     // application's view is what it held before.
                     const ibv_qp_state application_view = qp->state;
                     const int result = real_verbs().ibv_query_qp(qp, attr, mask, init_attr);
                     if (result == 0 && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_qp_queried(qp, attr, mask,
                                                                    application_view);
                     }
                     return result;
                   });
}

VF_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  return intercept("ibv_destroy_qp", VF_ARGS("{}", describe_qp(qp)), [&] {
    if (!vf::shim::shim_active()) return real_verbs().ibv_destroy_qp(qp);
    vf::FailoverEngine::instance().on_qp_destroy(qp);
    std::lock_guard lock(vf::shim::lifecycle_mutex());
    const int result = real_verbs().ibv_destroy_qp(qp);
    if (result == 0) vf::shim::forget_qp_ex(qp);
    return result;
  });
}

VF_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (real_verbs().ibv_qp_to_qp_ex == nullptr) {
    return vf::shim::unsupported_verb<ibv_qp_ex*>("ibv_qp_to_qp_ex");
  }
  return intercept("ibv_qp_to_qp_ex", VF_ARGS("{}", describe_qp(qp)),
                   [&] { return real_verbs().ibv_qp_to_qp_ex(qp); });
}

VF_EXPORT int ibv_query_ece(ibv_qp* qp, ibv_ece* ece) {
  if (real_verbs().ibv_query_ece == nullptr) return vf::shim::unsupported_verb<int>("ibv_query_ece");
  return intercept("ibv_query_ece", VF_ARGS("{}", describe_qp(qp)),
                   [&] { return real_verbs().ibv_query_ece(qp, ece); });
}

VF_EXPORT int ibv_set_ece(ibv_qp* qp, ibv_ece* ece) {
  if (real_verbs().ibv_set_ece == nullptr) return vf::shim::unsupported_verb<int>("ibv_set_ece");
  return intercept("ibv_set_ece",
                   VF_ARGS("{} vendor_id={:#x} options={:#x}", describe_qp(qp),
                           ece ? ece->vendor_id : 0, ece ? ece->options : 0),
                   [&] { return real_verbs().ibv_set_ece(qp, ece); });
}

VF_EXPORT int ibv_query_qp_data_in_order(ibv_qp* qp, enum ibv_wr_opcode op, uint32_t flags) {
  if (real_verbs().ibv_query_qp_data_in_order == nullptr) return 0;  // "not guaranteed"
  return intercept("ibv_query_qp_data_in_order",
                   VF_ARGS("{} op={} flags={:#x}", describe_qp(qp), static_cast<int>(op), flags),
                   [&] { return real_verbs().ibv_query_qp_data_in_order(qp, op, flags); });
}

VF_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return intercept("ibv_attach_mcast", VF_ARGS("{} lid={}", describe_qp(qp), lid),
                   [&] { return real_verbs().ibv_attach_mcast(qp, gid, lid); });
}

VF_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return intercept("ibv_detach_mcast", VF_ARGS("{} lid={}", describe_qp(qp), lid),
                   [&] { return real_verbs().ibv_detach_mcast(qp, gid, lid); });
}

namespace vf::shim::ops {

// The traced variants (VERBS_FAILOVER_TRACE): out of line, so that the plain path stays small.
[[gnu::noinline, gnu::cold]] int post_send_traced(ibv_qp* qp, VirtualQp* virtual_qp,
                                                  ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (virtual_qp != nullptr) {
    return intercept("ibv_post_send", VF_ARGS("{} {}", describe_qp(qp), describe_send_wr_chain(wr)),
                     [&] { return virtual_qp->post_send(wr, bad_wr); });
  }
  const ContextRecord* record = context_records().find(qp->context);
  if (record == nullptr) {
    *bad_wr = wr;
    return EINVAL;
  }
  return intercept("ibv_post_send", VF_ARGS("{} {}", describe_qp(qp), describe_send_wr_chain(wr)),
                   [&] { return record->ops.post_send(qp, wr, bad_wr); });
}

[[gnu::noinline, gnu::cold]] int post_recv_traced(ibv_qp* qp, VirtualQp* virtual_qp,
                                                  ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (virtual_qp != nullptr) {
    return intercept("ibv_post_recv", VF_ARGS("{} {}", describe_qp(qp), describe_recv_wr_chain(wr)),
                     [&] { return virtual_qp->post_recv(wr, bad_wr); });
  }
  const ContextRecord* record = context_records().find(qp->context);
  if (record == nullptr) {
    *bad_wr = wr;
    return EINVAL;
  }
  return intercept("ibv_post_recv", VF_ARGS("{} {}", describe_qp(qp), describe_recv_wr_chain(wr)),
                   [&] { return record->ops.post_recv(qp, wr, bad_wr); });
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  VirtualQp* virtual_qp = find_virtual_qp(qp);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0)) {
    return post_send_traced(qp, virtual_qp, wr, bad_wr);
  }
  if (virtual_qp != nullptr) return virtual_qp->post_send(wr, bad_wr);
  const ContextRecord* record = context_records().find(qp->context);
  if (__builtin_expect(record == nullptr, 0)) {
    *bad_wr = wr;
    return EINVAL;
  }
  return record->ops.post_send(qp, wr, bad_wr);
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  VirtualQp* virtual_qp = find_virtual_qp(qp);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0)) {
    return post_recv_traced(qp, virtual_qp, wr, bad_wr);
  }
  if (virtual_qp != nullptr) return virtual_qp->post_recv(wr, bad_wr);
  const ContextRecord* record = context_records().find(qp->context);
  if (__builtin_expect(record == nullptr, 0)) {
    *bad_wr = wr;
    return EINVAL;
  }
  return record->ops.post_recv(qp, wr, bad_wr);
}

ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  const ContextRecord* record = context_records().find(context);
  if (record == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return intercept(
      "ibv_create_qp_ex",
      VF_ARGS("{} {} comp_mask={:#x} send_ops_flags={:#x}", describe_context(context),
              describe_init_attr(reinterpret_cast<const ibv_qp_init_attr*>(attr)), attr->comp_mask,
              attr->send_ops_flags),
      [&] {
        std::lock_guard lock(lifecycle_mutex());
        ibv_qp* qp = record->create_qp_ex(context, attr);
        if (qp != nullptr && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
          manage_qp_ex(qp, attr->send_ops_flags);
        }
        const bool send_ops = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
        if (qp != nullptr && shim_active() && (attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
          if (send_ops && (attr->send_ops_flags & ~kProtectedSendOps) != 0) {
            VF_LOG_WARN("qp {}: unprotected — it asked for ibv_wr_* operations the shim does "
                        "not replay (send_ops_flags {:#x}; replayed: send, write, read, atomics)",
                        qp->qp_num, attr->send_ops_flags);
          } else if (send_ops && attr->srq != nullptr &&
                     (attr->send_ops_flags & kUnreplayableSendOps) != 0) {
            // A protected QP on an SRQ refuses them (docs/design.md §5h): one that declares them
            // keeps them, unprotected, as before the shim knew them.
            VF_LOG_WARN("qp {}: unprotected — it uses a shared receive queue and declares ibv_wr_* "
                        "operations the shim does not replay (send_ops_flags {:#x})",
                        qp->qp_num, attr->send_ops_flags);
          } else {
            FailoverEngine::instance().on_qp_created(qp, *attr);
            if (send_ops && FailoverEngine::instance().virtual_qp(qp) != nullptr) {
              install_protected_wr_hooks(reinterpret_cast<ibv_qp_ex*>(qp));
              VF_LOG_INFO("qp {}: uses the ibv_wr_* API (send_ops_flags {:#x}); its batches are "
                          "recorded for replay",
                          qp->qp_num, attr->send_ops_flags);
            }
          }
        }
        return qp;
      });
}

}  // namespace vf::shim::ops
