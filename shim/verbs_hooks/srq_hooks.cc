// Shared receive queues. A basic SRQ on a device with a backup is recorded by the failover
// engine (core/virtual_srq.h): its receives go through the record, its QPs are protected.
#include <infiniband/verbs.h>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/object_records.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"

using vf::FailoverEngine;
using vf::VirtualSrq;
using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

VF_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return intercept("ibv_create_srq",
                   VF_ARGS("pd={} max_wr={} max_sge={}", fmt::ptr(pd),
                           attr ? attr->attr.max_wr : 0, attr ? attr->attr.max_sge : 0),
                   [&] {
                     ibv_srq* srq = real_verbs().ibv_create_srq(pd, attr);
                     if (srq != nullptr) FailoverEngine::instance().on_srq_created(srq, pd);
                     return srq;
                   });
}

VF_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  return intercept("ibv_modify_srq", VF_ARGS("srq={} mask={:#x}", fmt::ptr(srq), mask),
                   [&] {
                     const int result = real_verbs().ibv_modify_srq(srq, attr, mask);
                     if (result == 0) FailoverEngine::instance().on_srq_modified(srq, attr, mask);
                     return result;
                   });
}

VF_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  return intercept("ibv_query_srq", VF_ARGS("srq={}", fmt::ptr(srq)),
                   [&] { return real_verbs().ibv_query_srq(srq, attr); });
}

VF_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  return intercept("ibv_destroy_srq", VF_ARGS("srq={}", fmt::ptr(srq)),
                   [&] {
                     const int result = real_verbs().ibv_destroy_srq(srq);
                     if (result == 0) FailoverEngine::instance().on_srq_destroyed(srq);
                     return result;
                   });
}

namespace vf::shim::ops {

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (VirtualSrq* virtual_srq = FailoverEngine::instance().virtual_srq(srq)) {
    if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) return virtual_srq->post_recv(wr, bad_wr);
    return intercept("ibv_post_srq_recv",
                     VF_ARGS("srq={} {}", fmt::ptr(srq), describe_recv_wr_chain(wr)),
                     [&] { return virtual_srq->post_recv(wr, bad_wr); });
  }
  const ContextRecord* record = context_records().find(srq->context);
  if (__builtin_expect(record == nullptr, 0)) {
    *bad_wr = wr;
    return EINVAL;
  }
  if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) {
    return record->ops.post_srq_recv(srq, wr, bad_wr);
  }
  return intercept("ibv_post_srq_recv",
                   VF_ARGS("srq={} {}", fmt::ptr(srq), describe_recv_wr_chain(wr)),
                   [&] { return record->ops.post_srq_recv(srq, wr, bad_wr); });
}

ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  const ContextRecord* record = context_records().find(context);
  if (record == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return intercept("ibv_create_srq_ex",
                   VF_ARGS("{} type={} max_wr={}", describe_context(context),
                           static_cast<int>(attr->srq_type), attr->attr.max_wr),
                   [&] {
                     ibv_srq* srq = record->create_srq_ex(context, attr);
                     const bool basic = !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ||
                                        attr->srq_type == IBV_SRQT_BASIC;
                     if (srq != nullptr && basic && srq->pd != nullptr) {
                       FailoverEngine::instance().on_srq_created(srq, srq->pd);
                     }
                     return srq;
                   });
}

}  // namespace vf::shim::ops
