// FAKE libibverbs (verbs-failover test double) — the RC datapath and the deterministic progress
// engine.
//
// Progress model: a "progress step" happens at the end of every post_send / post_recv /
// post_srq_recv / ibv_wr_complete, at the start of every poll_cq, on modify_qp to RTS and on
// fake_verbs_progress(). One step bumps the global step counter and walks all QPs in creation
// order; each QP executes its send queue from the head until the head cannot finish this step.
// No background thread exists, so the same sequence of verbs calls always gives the same result.
//
// A head WR cannot finish when: it is held by an injected delay (ready_step not reached), the
// path is dead (silent drop, remote port down, remote QP missing or not >= RTR) — one transport
// try per step, RETRY_EXC_ERR after retry_cnt retries — or the responder has no receive — one RNR
// NAK per step, RNR_RETRY_EXC_ERR after rnr_retry retries, never for rnr_retry 7 (infinite).
// Everything else completes in the same step it is tried (an instantly acknowledging wire), unless
// its acknowledgement is lost (fake_verbs_set_lose_acks): then the responder has executed it and
// the requester retries it like a lost packet until a retry is acknowledged or the retries run out.
#include <cerrno>
#include <cstring>

#include <algorithm>

#include "internal.h"

namespace fake_verbs {

namespace {

ibv_wc_opcode wc_opcode_for(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    default:
      return IBV_WC_SEND;
  }
}

bool is_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

uint32_t payload_length(const SendWork& w) {
  if (w.is_inline) return uint32_t(w.inline_data.size());
  uint64_t total = 0;
  for (const ibv_sge& s : w.sges) total += s.length;
  return uint32_t(total);
}

void complete_send(Qp* qp, const SendWork& w, ibv_wc_status status) {
  if (status != IBV_WC_SUCCESS) ++qp->stats.completions_with_error;
  if (status == IBV_WC_SUCCESS && !w.signaled) return;  // unsignaled success: no CQE
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode_for(w.opcode);
  wc.qp_num = qp->shell.qpx.qp_base.qp_num;
  if (status == IBV_WC_SUCCESS) wc.byte_len = is_atomic(w.opcode) ? 8 : payload_length(w);
  push_completion_locked(qp->send_cq, wc);
}

// Gathers the local payload; false = local protection error.
bool gather(Qp* qp, const SendWork& w, std::vector<uint8_t>& out) {
  if (w.is_inline) {
    out = w.inline_data;
    return true;
  }
  out.clear();
  for (const ibv_sge& s : w.sges) {
    if (s.length == 0) continue;
    Mr* mr = find_mr_by_lkey_locked(qp->pd, s.lkey);
    uint8_t* p = mr != nullptr ? translate_mr_range(mr, s.addr, s.length) : nullptr;
    if (p == nullptr) return false;
    out.insert(out.end(), p, p + s.length);
  }
  return true;
}

Qp* resolve_remote(Qp* qp, Device** remote_dev) {
  *remote_dev = find_device_by_gid_locked(qp->attr.ah_attr.grh.dgid);
  if (*remote_dev == nullptr) return nullptr;
  return find_qp_locked(*remote_dev, qp->attr.dest_qp_num);
}

// One try of the head WR lost on the wire: false while retries remain (it waits for the next
// step), true once it failed with RETRY_EXC_ERR.
bool lose_try(Qp* qp, SendWork& w) {
  ++w.transport_tries;
  ++qp->stats.transport_retries;
  ++qp->ctx->device->stats.dropped_packets;
  if (w.transport_tries <= qp->attr.retry_cnt) return false;
  if (qp->attr.retry_cnt == 7 && qp->ctx->device->retry_without_end_at_7) return false;
  fail_head_locked(qp, IBV_WC_RETRY_EXC_ERR);
  return true;
}

Request request_of(Qp* qp, const SendWork& w, const std::vector<uint8_t>& payload) {
  Request req;
  req.opcode = w.opcode;
  req.src_qpn = qp->shell.qpx.qp_base.qp_num;
  req.solicited = (w.send_flags & IBV_SEND_SOLICITED) != 0;
  req.imm_data = w.imm_data;
  req.remote_addr = w.remote_addr;
  req.rkey = w.rkey;
  req.compare_add = w.compare_add;
  req.swap = w.swap;
  req.length = is_atomic(w.opcode) ? 8 : payload_length(w);
  req.payload = payload.data();
  return req;
}

}  // namespace

// The requester learns what the responder did with its head WR. True if the WR finished (either
// way), false if it waits (an RNR NAK with retries left, or an acknowledgement lost).
bool apply_response_locked(Qp* qp, Response response, const std::vector<uint8_t>& reply) {
  SendWork& w = qp->send_queue.front();
  Device* local = qp->ctx->device;
  switch (response) {
    case Response::kRnrNak:
      ++w.rnr_naks;
      ++qp->stats.rnr_naks;
      if (qp->attr.rnr_retry == 7 || w.rnr_naks <= qp->attr.rnr_retry) return false;
      fail_head_locked(qp, IBV_WC_RNR_RETRY_EXC_ERR);
      return true;
    case Response::kRemAccessErr:
      fail_head_locked(qp, IBV_WC_REM_ACCESS_ERR);
      return true;
    case Response::kRemInvReqErr:
      fail_head_locked(qp, IBV_WC_REM_INV_REQ_ERR);
      return true;
    case Response::kRemOpErr:
      fail_head_locked(qp, IBV_WC_REM_OP_ERR);
      return true;
    case Response::kAck:
      break;
  }
  // A retry of an executed request (its acknowledgement was lost in-process) finds its data
  // already placed; nothing is checked or written again.
  if ((w.opcode == IBV_WR_RDMA_READ || is_atomic(w.opcode)) && !w.executed) {
    // The response lands in the requester's buffers, checked again now: they may have been
    // deregistered while the request was on the wire.
    std::vector<uint8_t*> where;
    if (check_scatter(qp->pd, w.sges, reply.size(), &where) != ScatterResult::kOk) {
      fail_head_locked(qp, IBV_WC_LOC_PROT_ERR);
      return true;
    }
    scatter(w.sges, where, reply.data(), reply.size());
  }
  if (!w.executed) {
    ++qp->stats.messages_sent;
    ++local->stats.tx_messages;
  }
  if (local->lose_acks > 0 && !qp->wire) {  // executed, its acknowledgement lost: a retry
    --local->lose_acks;
    ++local->stats.acks_lost;
    w.executed = true;
    return lose_try(qp, w);
  }
  SendWork done = std::move(qp->send_queue.front());
  qp->send_queue.pop_front();
  complete_send(qp, done, IBV_WC_SUCCESS);
  return true;
}

namespace {

// The head WR of a QP whose peer lives in another process (wire.cc carries it): one try is one
// request datagram; it is lost when no answer comes within the QP's transport timeout (a dead
// peer process, a dropping or downed device at either end, a peer QP not ready), and resent.
bool execute_head_over_wire(Qp* qp, SendWork& w, int remote_index,
                            const std::vector<uint8_t>& payload) {
  const uint64_t now = wire_now_ns();
  if (w.wire_sent) {
    if (qp->wire_response && qp->wire_response->psn == w.psn) {
      WireResponse got = std::move(*qp->wire_response);
      qp->wire_response.reset();
      w.wire_sent = false;
      if (got.response == Response::kRnrNak) w.wire_retry_at_ns = now + kWireRnrDelayNs;
      return apply_response_locked(qp, got.response, got.reply);
    }
    if (now < w.wire_deadline_ns) return false;
    w.wire_sent = false;
    lose_try(qp, w);
    return true;  // failed (RETRY_EXC_ERR), or pump() calls again and it is resent, data read anew
  }
  if (now < w.wire_retry_at_ns) return false;
  if (!w.psn_assigned) {
    w.psn = qp->wire_next_psn;
    qp->wire_next_psn = (qp->wire_next_psn + 1) & 0xffffff;
    w.psn_assigned = true;
  }
  if (!qp->ctx->device->drop) wire_send_request_locked(qp, w.psn, remote_index, request_of(qp, w, payload));
  w.wire_sent = true;
  w.wire_deadline_ns = now + wire_transport_timeout_ns(qp->attr.timeout);
  return false;
}

// Executes the head WR of 'qp'. Returns true if it finished (either way), false if it must wait.
bool execute_head(Qp* qp) {
  Fabric& f = fabric();
  SendWork& w = qp->send_queue.front();
  Device* local = qp->ctx->device;
  if (!local->port_up) {  // the local port knows its link is gone: no retry can help
    fail_head_locked(qp, IBV_WC_RETRY_EXC_ERR);
    return true;
  }
  Device* remote_dev = nullptr;
  Qp* r = resolve_remote(qp, &remote_dev);
  const int wire_index =
      remote_dev == nullptr ? wire_device_index_for_gid(qp->attr.ah_attr.grh.dgid) : -1;
  if (f.step < w.ready_step && wire_index < 0) {  // injected delay still running
    // Held on the wire: lost like any packet once either end drops everything.
    if (local->drop || (remote_dev != nullptr && remote_dev->drop)) return lose_try(qp, w);
    return false;
  }

  // A try on the wire waits for its answer; nothing is read or checked again until it is resent.
  if (wire_index >= 0 && w.wire_sent) return execute_head_over_wire(qp, w, wire_index, {});

  // Local checks first, as hardware does before putting anything on the wire.
  std::vector<uint8_t> payload;
  const bool reads_back = w.opcode == IBV_WR_RDMA_READ || is_atomic(w.opcode);
  const size_t length = is_atomic(w.opcode) ? 8 : payload_length(w);
  if (reads_back) {
    if (check_scatter(qp->pd, w.sges, length, nullptr) != ScatterResult::kOk) {
      fail_head_locked(qp, IBV_WC_LOC_PROT_ERR);
      return true;
    }
  } else if (!gather(qp, w, payload)) {
    fail_head_locked(qp, IBV_WC_LOC_PROT_ERR);
    return true;
  }
  if (wire_index >= 0) {
    qp->wire = true;
    return execute_head_over_wire(qp, w, wire_index, payload);
  }
  qp->wire = false;

  // The wire: a dead path looks exactly like packet loss to the requester.
  ibv_qp_state rstate = r != nullptr ? r->attr.qp_state : IBV_QPS_RESET;
  // Each end takes the other's packets only if they are addressed as it is connected (rxe's
  // check_addr), the request on its way in and the answer on its way back.
  bool path_alive = remote_dev != nullptr && !local->drop && !remote_dev->drop &&
                    remote_dev->port_up &&
                    (rstate == IBV_QPS_RTR || rstate == IBV_QPS_RTS || rstate == IBV_QPS_SQD) &&
                    addressed_to_locked(r, source_gid_locked(qp), qp->attr.ah_attr.grh.dgid) &&
                    addressed_to_locked(qp, source_gid_locked(r), r->attr.ah_attr.grh.dgid);
  if (!path_alive) return lose_try(qp, w);
  if (w.executed) {
    // A retry of a request the responder executed: a duplicate PSN, acknowledged again (a read's
    // or an atomic's response is resent from the responder's record), nothing executed twice.
    // That acknowledgement can be lost too.
    if (local->lose_acks > 0) {
      --local->lose_acks;
      return lose_try(qp, w);
    }
    return apply_response_locked(qp, Response::kAck, w.recorded_reply);
  }
  std::vector<uint8_t> reply;
  const Response response = respond_locked(r, request_of(qp, w, payload), &reply);
  if (response == Response::kAck) w.recorded_reply = reply;
  return apply_response_locked(qp, response, reply);
}

void pump(Qp* qp) {
  while (qp->attr.qp_state == IBV_QPS_RTS && !qp->send_queue.empty())
    if (!execute_head(qp)) break;
}

}  // namespace

void complete_recv_error_locked(Qp* qp, const RecvWork& r, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = r.wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->shell.qpx.qp_base.qp_num;
  push_recv_completion_locked(qp, wc);
}

// Head WR failed: it completes with 'status' (always reported), the QP enters ERR, rest flushes.
void fail_head_locked(Qp* qp, ibv_wc_status status) {
  SendWork w = std::move(qp->send_queue.front());
  qp->send_queue.pop_front();
  complete_send(qp, w, status);
  move_qp_to_error_locked(qp);
}

void push_recv_completion_locked(Qp* qp, const ibv_wc& wc) {
  const unsigned delay = qp->ctx->device->recv_cqe_delay_steps;
  if (delay == 0 && qp->late_recv_cqes.empty()) {
    push_completion_locked(qp->recv_cq, wc);
    return;
  }
  uint64_t due = fabric().step + delay;
  if (!qp->late_recv_cqes.empty()) due = std::max(due, qp->late_recv_cqes.back().first);
  qp->late_recv_cqes.emplace_back(due, wc);
}

void progress_step_locked() {
  Fabric& f = fabric();
  ++f.step;
  if (f.wire) wire_serve_locked();
  for (Qp* qp : f.qps) {
    while (!qp->late_recv_cqes.empty() && qp->late_recv_cqes.front().first <= f.step) {
      push_completion_locked(qp->recv_cq, qp->late_recv_cqes.front().second);
      qp->late_recv_cqes.pop_front();
    }
  }
  // Index loop: execution never creates or destroys QPs, but stay robust anyway.
  for (size_t i = 0; i < f.qps.size(); ++i) pump(f.qps[i]);
}

void move_qp_to_error_locked(Qp* qp) {
  // Like a device: the QP's own state changes; libibverbs' cached qp->state does not (only
  // ibv_modify_qp updates it), so the application's view is not touched here.
  qp->attr.qp_state = IBV_QPS_ERR;
  while (!qp->send_queue.empty()) {
    SendWork w = std::move(qp->send_queue.front());
    qp->send_queue.pop_front();
    // Error completions (flushes included) are reported even for unsignaled WRs, so the owner
    // can reclaim every buffer; complete_send() only suppresses successful unsignaled ones.
    complete_send(qp, w, IBV_WC_WR_FLUSH_ERR);
  }
  while (!qp->recv_queue.empty()) {
    RecvWork rw = std::move(qp->recv_queue.front());
    qp->recv_queue.pop_front();
    complete_recv_error_locked(qp, rw, IBV_WC_WR_FLUSH_ERR);
  }
}

int validate_and_build_send_locked(Qp* qp, const ibv_send_wr* wr, SendWork& w) {
  switch (wr->opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      break;
    default:
      return EINVAL;  // bind/invalidate/TSO/... are not modelled
  }
  if (wr->num_sge < 0 || uint32_t(wr->num_sge) > qp->cap.max_send_sge) return EINVAL;
  w.wr_id = wr->wr_id;
  w.opcode = wr->opcode;
  w.send_flags = wr->send_flags;
  w.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
  w.imm_data = wr->imm_data;
  if (is_atomic(wr->opcode)) {
    if (wr->num_sge != 1 || wr->sg_list[0].length != 8) return EINVAL;
    w.remote_addr = wr->wr.atomic.remote_addr;
    w.rkey = wr->wr.atomic.rkey;
    w.compare_add = wr->wr.atomic.compare_add;
    w.swap = wr->wr.atomic.swap;
  } else if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
    w.remote_addr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
  }
  if (wr->send_flags & IBV_SEND_INLINE) {
    if (wr->opcode == IBV_WR_RDMA_READ || is_atomic(wr->opcode)) return EINVAL;
    size_t total = 0;
    for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
    if (total > qp->cap.max_inline_data) return EINVAL;
    // Inline data is copied now: the caller may reuse the buffer as soon as post returns.
    w.is_inline = true;
    for (int i = 0; i < wr->num_sge; ++i) {
      auto* p = reinterpret_cast<const uint8_t*>(uintptr_t(wr->sg_list[i].addr));
      w.inline_data.insert(w.inline_data.end(), p, p + wr->sg_list[i].length);
    }
  } else {
    w.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
  }
  return 0;
}

int enqueue_sends_locked(Qp* qp, std::vector<SendWork>&& works) {
  if (qp->send_queue.size() + works.size() > qp->cap.max_send_wr) return ENOMEM;
  Fabric& f = fabric();
  for (SendWork& w : works) {
    if (qp->attr.qp_state == IBV_QPS_ERR) {
      complete_send(qp, w, IBV_WC_WR_FLUSH_ERR);  // real HW: posting to ERR flushes at once
      continue;
    }
    // Delay is fixed at post time from both ends' settings; the step that follows this post is
    // step f.step + 1, so delay 0 means "deliverable in the post's own progress step".
    Device* remote_dev = find_device_by_gid_locked(qp->attr.ah_attr.grh.dgid);
    unsigned delay = qp->ctx->device->delay_steps;
    if (remote_dev != nullptr && remote_dev->delay_steps > delay) delay = remote_dev->delay_steps;
    w.ready_step = f.step + 1 + delay;
    qp->send_queue.push_back(std::move(w));
  }
  return 0;
}

}  // namespace fake_verbs
