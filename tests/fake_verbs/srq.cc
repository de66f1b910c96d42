// FAKE libibverbs (verbs-failover test double) — shared receive queues (basic SRQs only).
// Receives are consumed in post order by whichever attached QP gets a message first; the limit
// event (IBV_EVENT_SRQ_LIMIT_REACHED) fires once when the queue drops below an armed limit.
#include <cerrno>

#include "internal.h"

using namespace fake_verbs;

namespace {

ibv_srq* create_srq_locked(ibv_pd* pd, void* srq_context, ibv_srq_attr& a) {
  if (a.max_wr < 1 || a.max_wr > uint32_t(kMaxSrqWr) || a.max_sge > uint32_t(kMaxSge) ||
      a.srq_limit > a.max_wr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* srq = new Srq();
  srq->shell.impl = srq;
  srq->pd = to_pd(pd);
  srq->max_wr = a.max_wr;
  srq->max_sge = a.max_sge;
  srq->limit = a.srq_limit;
  ibv_srq& s = srq->shell.srq;
  s.context = pd->context;
  s.srq_context = srq_context;
  s.pd = pd;
  s.handle = fabric().next_srq_num++;
  pthread_mutex_init(&s.mutex, nullptr);
  pthread_cond_init(&s.cond, nullptr);
  ++srq->pd->refs;
  return &s;
}

}  // namespace

FAKE_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
  auto lock = fabric_lock();
  return create_srq_locked(pd, init->srq_context, init->attr);
}

namespace fake_verbs {

ibv_srq* create_srq_ex_op(ibv_context*, ibv_srq_init_attr_ex* init) {
  const uint32_t known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
  if ((init->comp_mask & ~known) || !(init->comp_mask & IBV_SRQ_INIT_ATTR_PD) ||
      ((init->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && init->srq_type != IBV_SRQT_BASIC)) {
    errno = EOPNOTSUPP;  // XRC and tag-matching SRQs are not modelled
    return nullptr;
  }
  auto lock = fabric_lock();
  return create_srq_locked(init->pd, init->srq_context, init->attr);
}

int post_srq_recv_op(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  auto lock = fabric_lock();
  Srq* srq = to_srq(ibsrq);
  int err = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || uint32_t(wr->num_sge) > srq->max_sge) {
      err = EINVAL;
      break;
    }
    if (srq->receives.size() >= srq->max_wr) {
      err = ENOMEM;
      break;
    }
    RecvWork rw;
    rw.wr_id = wr->wr_id;
    rw.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    srq->receives.push_back(std::move(rw));
  }
  if (err != 0 && bad_wr != nullptr) *bad_wr = wr;
  progress_step_locked();
  return err;
}

}  // namespace fake_verbs

FAKE_EXPORT int ibv_modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
  auto lock = fabric_lock();
  Srq* srq = to_srq(ibsrq);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  uint32_t max_wr = (mask & IBV_SRQ_MAX_WR) ? attr->max_wr : srq->max_wr;
  if ((mask & IBV_SRQ_MAX_WR) &&
      (max_wr < srq->receives.size() || max_wr < 1 || max_wr > uint32_t(kMaxSrqWr)))
    return EINVAL;
  if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > max_wr) return EINVAL;
  srq->max_wr = max_wr;
  if (mask & IBV_SRQ_LIMIT) srq->limit = attr->srq_limit;
  return 0;
}

FAKE_EXPORT int ibv_query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  auto lock = fabric_lock();
  Srq* srq = to_srq(ibsrq);
  attr->max_wr = srq->max_wr;
  attr->max_sge = srq->max_sge;
  attr->srq_limit = srq->limit;
  return 0;
}

FAKE_EXPORT int ibv_destroy_srq(ibv_srq* ibsrq) {
  auto lock = fabric_lock();
  Srq* srq = to_srq(ibsrq);
  if (srq->qp_refs != 0) return EBUSY;
  --srq->pd->refs;
  pthread_mutex_destroy(&ibsrq->mutex);
  pthread_cond_destroy(&ibsrq->cond);
  delete srq;
  return 0;
}
