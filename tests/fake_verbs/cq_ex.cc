// FAKE libibverbs (verbs-failover test double) — the extended CQ polling iterator
// (ibv_start_poll / ibv_next_poll / ibv_end_poll / ibv_wc_read_*), over the same completion
// queue as ibv_poll_cq. start_poll is a progress step, exactly like poll_cq.
#include <cerrno>

#include "internal.h"

namespace fake_verbs {

namespace {

Cq* cq_of(ibv_cq_ex* cqx) {
  return reinterpret_cast<CqShell*>(cqx)->impl;
}

// Takes the oldest entry as "current" and mirrors status/wr_id into the public fields.
int take_next_locked(ibv_cq_ex* cqx) {
  Cq* cq = cq_of(cqx);
  if (cq->entries.empty()) return cq->overflowed ? EOVERFLOW : ENOENT;
  cq->current = cq->entries.front();
  cq->entries.pop_front();
  cqx->status = cq->current.status;
  cqx->wr_id = cq->current.wr_id;
  return 0;
}

int start_poll(ibv_cq_ex* cqx, ibv_poll_cq_attr* attr) {
  if (attr != nullptr && attr->comp_mask != 0) return EINVAL;
  auto lock = fabric_lock();
  progress_step_locked();
  return take_next_locked(cqx);
}

int next_poll(ibv_cq_ex* cqx) {
  auto lock = fabric_lock();
  return take_next_locked(cqx);
}

void end_poll(ibv_cq_ex*) {}

ibv_wc& cur(ibv_cq_ex* cqx) {
  return cq_of(cqx)->current;
}

enum ibv_wc_opcode read_opcode(ibv_cq_ex* c) {
  return cur(c).opcode;
}
uint32_t read_vendor_err(ibv_cq_ex* c) {
  return cur(c).vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* c) {
  return cur(c).byte_len;
}
__be32 read_imm_data(ibv_cq_ex* c) {
  return cur(c).imm_data;
}
uint32_t read_qp_num(ibv_cq_ex* c) {
  return cur(c).qp_num;
}
uint32_t read_src_qp(ibv_cq_ex* c) {
  return cur(c).src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* c) {
  return cur(c).wc_flags;
}
uint32_t read_slid(ibv_cq_ex* c) {
  return cur(c).slid;
}
uint8_t read_sl(ibv_cq_ex* c) {
  return cur(c).sl;
}
uint8_t read_dlid_path_bits(ibv_cq_ex* c) {
  return cur(c).dlid_path_bits;
}

}  // namespace

void fill_cq_ex_ops(ibv_cq_ex* cqx) {
  cqx->start_poll = start_poll;
  cqx->next_poll = next_poll;
  cqx->end_poll = end_poll;
  cqx->read_opcode = read_opcode;
  cqx->read_vendor_err = read_vendor_err;
  cqx->read_byte_len = read_byte_len;
  cqx->read_imm_data = read_imm_data;
  cqx->read_qp_num = read_qp_num;
  cqx->read_src_qp = read_src_qp;
  cqx->read_wc_flags = read_wc_flags;
  cqx->read_slid = read_slid;
  cqx->read_sl = read_sl;
  cqx->read_dlid_path_bits = read_dlid_path_bits;
  // read_completion_ts / _wallclock_ns, read_cvlan, read_flow_tag, read_tm_info stay NULL: the
  // matching IBV_WC_EX_WITH_* flags are refused at creation.
}

}  // namespace fake_verbs
