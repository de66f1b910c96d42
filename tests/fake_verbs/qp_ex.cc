// FAKE libibverbs (verbs-failover test double) — the ibv_qp_ex "new post send" API
// (ibv_wr_start / ibv_wr_* / ibv_wr_complete). Builders append to a per-QP batch without the
// fabric lock (a QP's batch belongs to the one thread building it, as with real providers);
// ibv_wr_complete validates the whole batch and posts all of it or none of it.
#include <cerrno>

#include "internal.h"

namespace fake_verbs {

namespace {

uint64_t send_ops_flag_for(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
      return IBV_QP_EX_WITH_SEND;
    case IBV_WR_SEND_WITH_IMM:
      return IBV_QP_EX_WITH_SEND_WITH_IMM;
    case IBV_WR_RDMA_WRITE:
      return IBV_QP_EX_WITH_RDMA_WRITE;
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    case IBV_WR_RDMA_READ:
      return IBV_QP_EX_WITH_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    default:
      return 0;
  }
}

void begin_wr(ibv_qp_ex* qpx, ibv_wr_opcode op) {
  Qp* qp = to_qp(qpx);
  if (!qp->in_batch || !(qp->send_ops_flags & send_ops_flag_for(op))) {
    qp->batch_error = EINVAL;  // opcode not enabled at create time, or no ibv_wr_start
    return;
  }
  SendWork w;
  w.wr_id = qpx->wr_id;
  w.opcode = op;
  w.send_flags = qpx->wr_flags;
  w.signaled = qp->sq_sig_all || (qpx->wr_flags & IBV_SEND_SIGNALED);
  qp->batch.push_back(std::move(w));
}

SendWork* current(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  if (qp->batch.empty()) {
    qp->batch_error = EINVAL;  // a data setter without a preceding ibv_wr_<opcode>
    return nullptr;
  }
  return &qp->batch.back();
}

void wr_start(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  qp->in_batch = true;
  qp->batch_error = 0;
  qp->batch.clear();
}

void wr_abort(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  qp->in_batch = false;
  qp->batch.clear();
}

int wr_complete(ibv_qp_ex* qpx) {
  Qp* qp = to_qp(qpx);
  auto lock = fabric_lock();
  int err = qp->in_batch ? qp->batch_error : EINVAL;
  ibv_qp_state st = qp->attr.qp_state;
  if (err == 0 && (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR)) err = EINVAL;
  if (err == 0) {
    for (const SendWork& w : qp->batch) {
      if (w.sges.size() > qp->cap.max_send_sge) err = EINVAL;
      bool atomic =
          w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
      if (atomic && (w.sges.size() != 1 || w.sges[0].length != 8)) err = EINVAL;
    }
  }
  if (err == 0) err = enqueue_sends_locked(qp, std::move(qp->batch));
  qp->in_batch = false;
  qp->batch.clear();
  progress_step_locked();
  return err;
}

void wr_send(ibv_qp_ex* qpx) {
  begin_wr(qpx, IBV_WR_SEND);
}

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm) {
  begin_wr(qpx, IBV_WR_SEND_WITH_IMM);
  if (SendWork* w = current(qpx)) w->imm_data = imm;
}

void set_rdma(ibv_qp_ex* qpx, ibv_wr_opcode op, uint32_t rkey, uint64_t addr) {
  begin_wr(qpx, op);
  if (SendWork* w = current(qpx)) {
    w->rkey = rkey;
    w->remote_addr = addr;
  }
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
  set_rdma(qpx, IBV_WR_RDMA_WRITE, rkey, addr);
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
  set_rdma(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr);
  if (SendWork* w = current(qpx)) w->imm_data = imm;
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
  set_rdma(qpx, IBV_WR_RDMA_READ, rkey, addr);
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t compare,
                       uint64_t swap) {
  set_rdma(qpx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr);
  if (SendWork* w = current(qpx)) {
    w->compare_add = compare;
    w->swap = swap;
  }
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
  set_rdma(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr);
  if (SendWork* w = current(qpx)) w->compare_add = add;
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (SendWork* w = current(qpx)) w->sges.assign(1, ibv_sge{addr, length, lkey});
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* list) {
  if (SendWork* w = current(qpx)) w->sges.assign(list, list + num_sge);
}

// Inline data is copied right here, so the buffer is reusable as soon as the setter returns.
void append_inline(ibv_qp_ex* qpx, SendWork* w, const void* addr, size_t length) {
  Qp* qp = to_qp(qpx);
  if (w->opcode == IBV_WR_RDMA_READ || w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
      w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
      w->inline_data.size() + length > qp->cap.max_inline_data) {
    qp->batch_error = EINVAL;
    return;
  }
  auto* p = static_cast<const uint8_t*>(addr);
  w->is_inline = true;
  w->inline_data.insert(w->inline_data.end(), p, p + length);
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  if (SendWork* w = current(qpx)) {
    w->inline_data.clear();
    append_inline(qpx, w, addr, length);
  }
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* list) {
  if (SendWork* w = current(qpx)) {
    w->inline_data.clear();
    for (size_t i = 0; i < num_buf; ++i) append_inline(qpx, w, list[i].addr, list[i].length);
  }
}

}  // namespace

void fill_qp_ex_ops(ibv_qp_ex* qpx) {
  qpx->wr_start = wr_start;
  qpx->wr_complete = wr_complete;
  qpx->wr_abort = wr_abort;
  qpx->wr_send = wr_send;
  qpx->wr_send_imm = wr_send_imm;
  qpx->wr_rdma_write = wr_rdma_write;
  qpx->wr_rdma_write_imm = wr_rdma_write_imm;
  qpx->wr_rdma_read = wr_rdma_read;
  qpx->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  qpx->wr_atomic_fetch_add = wr_atomic_fetch_add;
  qpx->wr_set_sge = wr_set_sge;
  qpx->wr_set_sge_list = wr_set_sge_list;
  qpx->wr_set_inline_data = wr_set_inline_data;
  qpx->wr_set_inline_data_list = wr_set_inline_data_list;
  // wr_bind_mw, wr_local_inv, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn and
  // wr_atomic_write stay NULL: not modelled (RC, no memory windows).
}

}  // namespace fake_verbs
