// FAKE libibverbs (verbs-failover test double) — RC queue pairs: creation, the
// RESET->INIT->RTR->RTS(->SQD)->ERR state machine with real-RC attribute-mask rules, query,
// destroy, and the post_send/post_recv entry points (validation here; execution in transport.cc).
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "internal.h"

using namespace fake_verbs;

namespace {

constexpr uint64_t kSupportedSendOps =
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

ibv_qp* create_qp_locked(ibv_context* context, ibv_qp_init_attr_ex* a) {
  if (a->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;  // RC only: the failover shim pairs RC QPs
    return nullptr;
  }
  if (a->send_cq == nullptr || a->recv_cq == nullptr || a->pd == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_cap& cap = a->cap;
  if (cap.max_send_wr > uint32_t(kMaxQpWr) || cap.max_send_sge > uint32_t(kMaxSge) ||
      cap.max_inline_data > uint32_t(kMaxInline) ||
      (a->srq == nullptr &&
       (cap.max_recv_wr > uint32_t(kMaxQpWr) || cap.max_recv_sge > uint32_t(kMaxSge)))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* qp = new Qp();
  qp->shell.impl = qp;
  qp->ctx = to_ctx(context);
  qp->pd = to_pd(a->pd);
  qp->send_cq = to_cq(a->send_cq);
  qp->recv_cq = to_cq(a->recv_cq);
  qp->srq = a->srq != nullptr ? to_srq(a->srq) : nullptr;
  if (qp->srq != nullptr) cap.max_recv_wr = cap.max_recv_sge = 0;  // SRQ owns receives
  qp->cap = cap;
  qp->sq_sig_all = a->sq_sig_all != 0;
  ibv_qp& q = qp->shell.qpx.qp_base;
  q.context = context;
  q.qp_context = a->qp_context;
  q.pd = a->pd;
  q.send_cq = a->send_cq;
  q.recv_cq = a->recv_cq;
  q.srq = a->srq;
  q.handle = fabric().next_key++;
  q.qp_num = fabric().next_qp_num++ & 0xffffff;
  q.state = IBV_QPS_RESET;
  q.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->attr.cap = cap;
  ++qp->pd->refs;
  ++qp->send_cq->qp_refs;
  ++qp->recv_cq->qp_refs;
  if (qp->srq != nullptr) ++qp->srq->qp_refs;
  ++qp->ctx->live_objects;
  fabric().qps.push_back(qp);
  return &q;
}

}  // namespace

FAKE_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  auto lock = fabric_lock();
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, attr, sizeof *attr);  // ibv_qp_init_attr is the prefix of the _ex struct
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = create_qp_locked(pd->context, &ex);
  if (qp != nullptr) attr->cap = ex.cap;
  return qp;
}

namespace fake_verbs {

ibv_qp* create_qp_ex_op(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  auto lock = fabric_lock();
  const uint32_t known =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if ((attr->comp_mask & ~known) != 0 || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) ||
      ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags != 0)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  bool extended = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
  if (extended && (attr->send_ops_flags & ~kSupportedSendOps) != 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp* ibqp = create_qp_locked(context, attr);
  if (ibqp == nullptr) return nullptr;
  Qp* qp = to_qp(ibqp);
  if (extended) {
    qp->extended = true;
    qp->send_ops_flags = attr->send_ops_flags;
    fill_qp_ex_ops(&qp->shell.qpx);
  }
  return ibqp;
}

}  // namespace fake_verbs

FAKE_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* ibqp) {
  Qp* qp = to_qp(ibqp);
  return qp->extended ? &qp->shell.qpx : nullptr;
}

namespace {

struct TransitionRule {
  ibv_qp_state from;
  ibv_qp_state to;
  int required;  // besides IBV_QP_STATE
  int optional;
};

// The RC rows of the IB spec / kernel ib_modify_qp_is_ok() table.
constexpr int kPathOpt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
constexpr TransitionRule kRcRules[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     kPathOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
         IBV_QP_MIN_RNR_TIMER},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
         IBV_QP_MIN_RNR_TIMER},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0,
     IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
         IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
};

const TransitionRule* find_rule(ibv_qp_state from, ibv_qp_state to) {
  for (const auto& r : kRcRules)
    if (r.from == from && r.to == to) return &r;
  return nullptr;
}

int validate_modify(Qp* qp, const ibv_qp_attr* attr, int mask) {
  ibv_qp_state cur = qp->attr.qp_state;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
  ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    // Any state may go to RESET or ERR; only STATE (and CUR_STATE) may be given.
    if (!(mask & IBV_QP_STATE) || (mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE))) return EINVAL;
    return 0;
  }
  if (next == IBV_QPS_SQE || next == IBV_QPS_UNKNOWN || cur == IBV_QPS_ERR) return EINVAL;
  const TransitionRule* rule = find_rule(cur, next);
  if (rule == nullptr) return EINVAL;
  int required = rule->required | ((cur != next) ? IBV_QP_STATE : 0);
  if ((mask & required) != required) return EINVAL;
  if (mask & ~(required | rule->optional | IBV_QP_STATE)) return EINVAL;
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_AV) &&
      (!attr->ah_attr.is_global || attr->ah_attr.grh.sgid_index >= kGidTableLen ||
       (attr->ah_attr.port_num != 0 && attr->ah_attr.port_num != 1)))
    return EINVAL;  // RoCE: every address vector needs a GRH with a valid source GID
  // An empty slot of the GID table (its address removed, fake_verbs_move_gid): the kernel's
  // rdma_get_gid_attr finds no valid entry and the modify fails with ENODATA.
  if ((mask & IBV_QP_AV) && gid_is_empty(qp->ctx->device->gids[attr->ah_attr.grh.sgid_index]))
    return ENODATA;
  if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
    return EINVAL;
  return 0;
}

void apply_modify(Qp* qp, const ibv_qp_attr* a, int mask) {
  ibv_qp_attr& s = qp->attr;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_ALT_PATH) {
    s.alt_ah_attr = a->alt_ah_attr;
    s.alt_pkey_index = a->alt_pkey_index;
    s.alt_port_num = a->alt_port_num;
    s.alt_timeout = a->alt_timeout;
  }
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a->rq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a->sq_psn;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_PATH_MIG_STATE) s.path_mig_state = a->path_mig_state;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = a->en_sqd_async_notify;
}

}  // namespace

FAKE_EXPORT int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  auto lock = fabric_lock();
  Qp* qp = to_qp(ibqp);
  if (int err = validate_modify(qp, attr, mask)) return err;
  apply_modify(qp, attr, mask);
  if (mask & IBV_QP_AV) qp->av_sgid = qp->ctx->device->gids[attr->ah_attr.grh.sgid_index];
  if (!(mask & IBV_QP_STATE)) return 0;
  ibv_qp_state next = attr->qp_state;
  if (next == IBV_QPS_ERR) {
    move_qp_to_error_locked(qp);  // flushes everything outstanding
  } else if (next == IBV_QPS_RESET) {
    // RESET silently discards work without completions, like the kernel; attributes restart.
    qp->send_queue.clear();
    qp->recv_queue.clear();
    qp->late_recv_cqes.clear();
    ibv_qp_cap cap = qp->attr.cap;
    qp->attr = ibv_qp_attr{};
    qp->attr.cap = cap;
    // The strictest reading of ibv_set_ece(3): options are used at the modify stages, so a reset
    // QP starts from the defaults and whoever reconnects it must set them again.
    qp->ece_options = kEceSupportedOptions;
  }
  // The wire's PSNs (wire.cc) start where the connection's attributes say.
  if (next == IBV_QPS_RTR) {
    qp->wire_expected_psn = qp->attr.rq_psn & 0xffffff;
    qp->wire_recent_replies.clear();
  }
  if (next == IBV_QPS_RTS && qp->attr.qp_state == IBV_QPS_RTR) {
    qp->wire_next_psn = qp->attr.sq_psn & 0xffffff;
    qp->wire_response.reset();
  }
  qp->attr.qp_state = next;
  ibqp->state = next;
  if (next == IBV_QPS_SQD && (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && attr->en_sqd_async_notify) {
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_SQ_DRAINED;  // nothing is ever half-sent in the fake
    ev.element.qp = ibqp;
    raise_async_event_locked(qp->ctx, ev);
  }
  if (next == IBV_QPS_RTS) progress_step_locked();  // work queued in SQD may now go
  return 0;
}

FAKE_EXPORT int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask,
                             ibv_qp_init_attr* init_attr) {
  auto lock = fabric_lock();
  Qp* qp = to_qp(ibqp);
  *attr = qp->attr;
  attr->qp_state = to_qp(ibqp)->attr.qp_state;
  attr->cur_qp_state = to_qp(ibqp)->attr.qp_state;
  attr->cap = qp->cap;
  attr->sq_draining = 0;
  if (init_attr != nullptr) {
    std::memset(init_attr, 0, sizeof *init_attr);
    init_attr->qp_context = ibqp->qp_context;
    init_attr->send_cq = ibqp->send_cq;
    init_attr->recv_cq = ibqp->recv_cq;
    init_attr->srq = ibqp->srq;
    init_attr->cap = qp->cap;
    init_attr->qp_type = IBV_QPT_RC;
    init_attr->sq_sig_all = qp->sq_sig_all ? 1 : 0;
  }
  // As libibverbs' ibv_query_qp does after the provider's query: the cached state follows.
  if (mask & IBV_QP_STATE) ibqp->state = attr->qp_state;
  return 0;
}

FAKE_EXPORT int ibv_destroy_qp(ibv_qp* ibqp) {
  auto lock = fabric_lock();
  Qp* qp = to_qp(ibqp);
  auto& qps = fabric().qps;
  qps.erase(std::remove(qps.begin(), qps.end(), qp), qps.end());
  --qp->pd->refs;
  --qp->send_cq->qp_refs;
  --qp->recv_cq->qp_refs;
  if (qp->srq != nullptr) --qp->srq->qp_refs;
  pthread_mutex_destroy(&ibqp->mutex);
  pthread_cond_destroy(&ibqp->cond);
  --qp->ctx->live_objects;
  delete qp;
  return 0;
}

namespace fake_verbs {

int post_send_op(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  auto lock = fabric_lock();
  Qp* qp = to_qp(ibqp);
  ibv_qp_state st = qp->attr.qp_state;
  int err = 0;
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) {
    err = EINVAL;  // the send queue is not enabled before RTS
    if (bad_wr != nullptr) *bad_wr = wr;
  }
  for (; err == 0 && wr != nullptr; wr = wr->next) {
    std::vector<SendWork> one(1);
    err = validate_and_build_send_locked(qp, wr, one[0]);
    if (err == 0) err = enqueue_sends_locked(qp, std::move(one));
    if (err != 0 && bad_wr != nullptr) *bad_wr = wr;
  }
  progress_step_locked();
  return err;
}

int post_recv_op(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  auto lock = fabric_lock();
  Qp* qp = to_qp(ibqp);
  int err = 0;
  if (qp->srq != nullptr || qp->attr.qp_state == IBV_QPS_RESET) err = EINVAL;
  for (; err == 0 && wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || uint32_t(wr->num_sge) > qp->cap.max_recv_sge) {
      err = EINVAL;
      break;
    }
    if (qp->recv_queue.size() >= qp->cap.max_recv_wr) {
      err = ENOMEM;
      break;
    }
    RecvWork rw;
    rw.wr_id = wr->wr_id;
    rw.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    if (qp->attr.qp_state == IBV_QPS_ERR && !qp->ctx->device->flush_on_modify_only) {
      ibv_wc wc{};
      wc.wr_id = rw.wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = ibqp->qp_num;
      push_recv_completion_locked(qp, wc);
      continue;
    }
    qp->recv_queue.push_back(std::move(rw));
  }
  if (err != 0 && bad_wr != nullptr) *bad_wr = wr;
  progress_step_locked();  // a waiting (RNR) sender may now be able to deliver
  return err;
}

}  // namespace fake_verbs
