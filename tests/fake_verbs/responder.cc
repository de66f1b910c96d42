// FAKE libibverbs (verbs-failover test double) — the responder side of RC: what the receiving NIC
// does with one request, the same whether the request came from a QP of this process (a function
// call) or over the wire from another process (wire.cc). The requester's side is transport.cc.
#include <cstring>

#include "internal.h"

namespace fake_verbs {

namespace {

bool consumes_receive(ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// Translates [addr, addr+len) of an MR's address space (iova) to host memory, or nullptr.
uint8_t* translate(Mr* mr, uint64_t addr, uint64_t len) {
  if (addr < mr->iova || len > mr->length || addr - mr->iova > mr->length - len) return nullptr;
  return mr->host_addr + (addr - mr->iova);
}

// Remote key check for RDMA/atomic: MR of the responder's PD, access bit on MR and QP, bounds.
uint8_t* remote_target(Qp* responder, const Request& req, uint64_t len, int access_bit) {
  if (!(responder->attr.qp_access_flags & access_bit)) return nullptr;
  Mr* mr = find_mr_by_rkey_locked(responder->pd, req.rkey);
  if (mr == nullptr || !(mr->access & access_bit)) return nullptr;
  return translate(mr, req.remote_addr, len);
}

std::deque<RecvWork>& receive_queue_of(Qp* responder) {
  return responder->srq != nullptr ? responder->srq->receives : responder->recv_queue;
}

void after_srq_consume(Qp* responder) {
  Srq* srq = responder->srq;
  if (srq == nullptr || srq->limit == 0 || srq->receives.size() >= srq->limit) return;
  srq->limit = 0;  // one-shot, re-armed by ibv_modify_srq(IBV_SRQ_LIMIT)
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
  ev.element.srq = &srq->shell.srq;
  raise_async_event_locked(responder->ctx, ev);
}

}  // namespace

uint8_t* translate_mr_range(Mr* mr, uint64_t addr, uint64_t len) {
  return translate(mr, addr, len);
}

ScatterResult check_scatter(Pd* pd, const std::vector<ibv_sge>& sges, size_t len,
                            std::vector<uint8_t*>* where) {
  size_t room = 0;
  for (const ibv_sge& s : sges) {
    if (s.length == 0) {
      if (where) where->push_back(nullptr);
      continue;
    }
    Mr* mr = find_mr_by_lkey_locked(pd, s.lkey);
    uint8_t* p = mr != nullptr ? translate(mr, s.addr, s.length) : nullptr;
    if (p == nullptr || !(mr->access & IBV_ACCESS_LOCAL_WRITE)) return ScatterResult::kProtection;
    if (where) where->push_back(p);
    room += s.length;
  }
  return room >= len ? ScatterResult::kOk : ScatterResult::kTooLong;
}

void scatter(const std::vector<ibv_sge>& sges, const std::vector<uint8_t*>& where,
             const uint8_t* data, size_t len) {
  for (size_t i = 0; i < sges.size() && len > 0; ++i) {
    size_t n = sges[i].length < len ? sges[i].length : len;
    if (n != 0) std::memcpy(where[i], data, n);
    data += n;
    len -= n;
  }
}

Response respond_locked(Qp* r, const Request& req, std::vector<uint8_t>* reply) {
  std::deque<RecvWork>& rq = receive_queue_of(r);
  if (consumes_receive(req.opcode) && rq.empty()) return Response::kRnrNak;

  uint32_t imm = 0;
  bool with_imm = false;
  switch (req.opcode) {
    case IBV_WR_SEND_WITH_IMM:
      imm = req.imm_data;
      with_imm = true;
      [[fallthrough]];
    case IBV_WR_SEND: {
      Pd* rpd = r->srq != nullptr ? r->srq->pd : r->pd;
      std::vector<uint8_t*> where;
      ScatterResult sr = check_scatter(rpd, rq.front().sges, req.length, &where);
      if (sr != ScatterResult::kOk) {
        RecvWork rw = std::move(rq.front());
        rq.pop_front();
        complete_recv_error_locked(
            r, rw, sr == ScatterResult::kTooLong ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR);
        move_qp_to_error_locked(r);
        return sr == ScatterResult::kTooLong ? Response::kRemInvReqErr : Response::kRemOpErr;
      }
      scatter(rq.front().sges, where, req.payload, req.length);
      break;
    }
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      imm = req.imm_data;
      with_imm = true;
      [[fallthrough]];
    case IBV_WR_RDMA_WRITE: {
      if (req.length != 0) {  // zero-length writes carry no rkey check, as on real RC
        uint8_t* dst = remote_target(r, req, req.length, IBV_ACCESS_REMOTE_WRITE);
        if (dst == nullptr) return Response::kRemAccessErr;
        std::memcpy(dst, req.payload, req.length);
      }
      break;
    }
    case IBV_WR_RDMA_READ: {
      reply->clear();
      if (req.length != 0) {
        uint8_t* src = remote_target(r, req, req.length, IBV_ACCESS_REMOTE_READ);
        if (src == nullptr) return Response::kRemAccessErr;
        reply->assign(src, src + req.length);
      }
      break;
    }
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      if (req.remote_addr % 8 != 0) return Response::kRemInvReqErr;
      uint8_t* target = remote_target(r, req, 8, IBV_ACCESS_REMOTE_ATOMIC);
      if (target == nullptr) return Response::kRemAccessErr;
      uint64_t old;
      std::memcpy(&old, target, 8);
      uint64_t next = req.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD
                          ? old + req.compare_add
                          : (old == req.compare_add ? req.swap : old);
      std::memcpy(target, &next, 8);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&old);
      reply->assign(bytes, bytes + 8);
      break;
    }
    default:
      return Response::kRemInvReqErr;  // validate_and_build_send_locked admits no other opcode
  }

  if (consumes_receive(req.opcode)) {
    RecvWork rw = std::move(rq.front());
    rq.pop_front();
    ibv_wc wc{};
    wc.wr_id = rw.wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    wc.byte_len = req.length;
    wc.qp_num = r->shell.qpx.qp_base.qp_num;
    wc.src_qp = req.src_qpn;
    if (with_imm) {
      wc.imm_data = imm;
      wc.wc_flags |= IBV_WC_WITH_IMM;
    }
    if (req.solicited) wc.wc_flags |= 1u << 31;  // see push_completion_locked
    push_recv_completion_locked(r, wc);
    after_srq_consume(r);
  }
  ++r->stats.messages_received;
  ++r->ctx->device->stats.rx_messages;
  return Response::kAck;
}

}  // namespace fake_verbs
