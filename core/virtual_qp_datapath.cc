// The data path of a VirtualQp and its CQs: what runs on the application's threads inside
// ibv_post_send, ibv_post_recv, ibv_poll_cq and the ibv_wr_* API. Healthy primary: record in the
// ring, then the provider's own call with the application's request (no copy of the request
// is posted, no allocation, no syscall). During and after a switch, requests are posted from the
// ring with the standby path's keys. The control side (pairing, switching) is core/failover/.

#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>

#include "core/clock.h"
#include "core/datapath_registries.h"
#include "core/log.h"
#include "core/verbs_names.h"
#include "core/virtual_qp.h"
#include "core/virtual_srq.h"

namespace vf {
namespace {

DatapathServices g_services;

// ibv_post_send's and ibv_post_recv's contract: every request before *bad_wr was posted (rxe and
// mlx5 post them). The first `count` requests of the chain `wr` (recorded: the shim refused the
// one after them) go to the provider through `post`, as copies linked among themselves, a few at
// a time: the application's list is never written (it may be shared, or read-only). Returns 0, or
// the provider's error with *bad_wr at the application's request it refused; *posted says how
// many were posted.
template <typename Wr, typename Post>
int post_chain_prefix(Wr* wr, std::uint32_t count, Wr** bad_wr, std::uint32_t* posted,
                      Post&& post) {
  static constexpr std::uint32_t kCopies = 16;
  Wr copies[kCopies];
  Wr* originals[kCopies];
  *posted = 0;
  while (*posted < count) {
    const std::uint32_t n = std::min(count - *posted, kCopies);
    for (std::uint32_t i = 0; i < n; ++i) {
      copies[i] = *wr;
      copies[i].next = i + 1 < n ? &copies[i + 1] : nullptr;
      originals[i] = wr;
      wr = wr->next;
    }
    Wr* bad = nullptr;
    const int result = post(copies, &bad);
    if (result != 0) {
      const std::uint32_t taken =
          bad >= copies && bad < copies + n ? static_cast<std::uint32_t>(bad - copies) : 0;
      *posted += taken;
      *bad_wr = originals[taken];
      return result;
    }
    *posted += n;
  }
  return 0;
}

}  // namespace

void set_datapath_services(const DatapathServices& services) { g_services = services; }
const DatapathServices& datapath_services() { return g_services; }

bool sges_for_path(int p, int primary_device, const ibv_sge* recorded, std::uint32_t count,
                   ibv_sge* out, std::uint32_t* missing) {
  for (std::uint32_t i = 0; i < count; ++i) {
    out[i] = recorded[i];
    // A zero-length SGE names no memory: providers skip it without looking at its lkey (mlx5,
    // rxe), and programs may leave that unset. Its key goes as it is when it has no twin.
    if (p == kStandby && !g_services.translate_lkey(primary_device, recorded[i].lkey, &out[i].lkey)) {
      out[i].lkey = recorded[i].lkey;
      if (recorded[i].length == 0) continue;
      *missing = recorded[i].lkey;
      return false;
    }
  }
  return true;
}

bool is_link_failure(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:     // transport retries exhausted: the peer is unreachable
    case IBV_WC_RESP_TIMEOUT_ERR:  // no response
    case IBV_WC_FATAL_ERR:         // the device/port failed
    case IBV_WC_GENERAL_ERR:
    case IBV_WC_WR_FLUSH_ERR:      // the QP went to error (after a link failure: not the app's)
    // Soft-RoCE completes the requests it could not transmit (its netdev went down) with a
    // local QP operation error; other providers use it for internal faults. Either way the
    // request is replayed on the other path, and a request that is itself bad fails there too
    // and then reaches the application.
    case IBV_WC_LOC_QP_OP_ERR:
      return true;
    default:
      return false;  // protection, length, access, RNR: the application's doing
  }
}

VirtualQp::VirtualQp(ibv_qp* qp, const ibv_context_ops* ops, const ibv_qp_cap& cap, bool signal_all,
                     CqState* scq, CqState* rcq)
    : app_qp(qp),
      vqpn(qp->qp_num),
      provider(ops),
      sig_all(signal_all),
      send_cq(scq),
      recv_cq(rcq),
      max_inline(cap.max_inline_data),
      max_send_sge(std::max<std::uint32_t>(cap.max_send_sge, 1)),
      send_ring_(cap.max_send_wr, cap.max_send_sge, cap.max_inline_data),
      recv_ring_(cap.max_recv_wr, cap.max_recv_sge) {
  const std::size_t batch = std::max<std::uint32_t>(cap.max_send_wr, 1);
  batch_.wrs.resize(batch);
  batch_.sges.resize(batch * max_send_sge);
  batch_.inline_data.resize(batch * max_inline);
  held_errors_.reserve(static_cast<std::size_t>(cap.max_send_wr) + cap.max_recv_wr + 16);
}

// ---------------------------------------------------------------- posting

// The fast paths (healthy primary) are inline in virtual_qp.h; these are their rare branches,
// out of line so that the fast paths stay small.

int VirtualQp::post_send_not_direct_locked(ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (mode_ == PostMode::kBypass) {
    lock_.unlock();
    return provider->post_send(app_qp, wr, bad_wr);
  }
  const int result = post_send_routed(wr, bad_wr);
  lock_.unlock();
  if (result == EOPNOTSUPP) log_refused_opcode((*bad_wr)->opcode);
  return result;
}

void VirtualQp::log_refused_opcode(ibv_wr_opcode opcode) {
  // Once per QP: an application that retries would flood the log.
  if (refused_logged_.exchange(true, std::memory_order_relaxed)) return;
  VF_LOG_ERROR("qp {}: {} refused (EOPNOTSUPP): it names an object of one device (or is not "
               "replayable), and the standby path carries the traffic; it is accepted again, "
               "and the QP becomes pass-through, once the traffic is back on the primary",
               vqpn, wr_opcode_name(opcode));
}

int VirtualQp::refuse_send_locked(ibv_send_wr* wr, ibv_send_wr* refused, std::uint32_t recorded,
                                  int error, ibv_send_wr** bad_wr) {
  std::uint32_t posted = 0;
  const int result = post_chain_prefix(wr, recorded, bad_wr, &posted,
                                       [&](ibv_send_wr* copies, ibv_send_wr** bad) {
                                         return provider->post_send(app_qp, copies, bad);
                                       });
  send_ring_.drop_newest(recorded - posted);
  next_send_to_post_ = send_ring_.next_sequence();
  if (result != 0) {
    lock_.unlock();
    return result;
  }
  if (error == RetransmitRing::kNotReplayable && may_pass_through_locked()) {
    // The provider gets the rest of the chain, as without the shim; the QP runs pass-through
    // from now on only if it took the request (a refused one posted nothing the ring misses).
    ibv_send_wr* provider_bad = nullptr;
    const int provider_result = provider->post_send(app_qp, refused, &provider_bad);
    if (provider_result == 0 || provider_bad != refused) {
      become_pass_through_locked(refused->opcode);
    }
    lock_.unlock();
    if (provider_result != 0) *bad_wr = provider_bad;
    return provider_result;
  }
  lock_.unlock();
  *bad_wr = refused;
  if (error == RetransmitRing::kNotReplayable) {
    log_refused_opcode(refused->opcode);
    return EOPNOTSUPP;
  }
  return error;
}

// A healthy primary with nothing of a failure pending (a link error not yet acted on would start
// a switch that this request must not miss), and no shared receive queue (its group may move to
// the standby without a pass-through member, which would keep taking receives from the SRQ the
// group left: docs/design.md §5h).
bool VirtualQp::may_pass_through_locked() const {
  return srq == nullptr && !link_error_seen.load(std::memory_order_relaxed) &&
         held_errors_.empty();
}

void VirtualQp::become_pass_through_locked(ibv_wr_opcode opcode) {
  mode_.store(PostMode::kBypass, std::memory_order_relaxed);
  int none = -1;
  if (pass_through_opcode.compare_exchange_strong(none, static_cast<int>(opcode),
                                                  std::memory_order_relaxed) &&
      g_services.wake_engine) {
    g_services.wake_engine();
  }
}

void VirtualQp::drop_unposted_sends_locked(ibv_send_wr* wr, const ibv_send_wr* bad,
                                           std::uint32_t recorded) {
  std::uint32_t posted = 0;
  for (ibv_send_wr* w = wr; w != nullptr && w != bad; w = w->next) ++posted;
  send_ring_.drop_newest(recorded - posted);
}

int VirtualQp::post_recv_not_direct_locked(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (mode_ == PostMode::kBypass) {
    lock_.unlock();
    return provider->post_recv(app_qp, wr, bad_wr);
  }
  const int result = post_recv_routed(wr, bad_wr);
  lock_.unlock();
  return result;
}

int VirtualQp::refuse_recv_locked(ibv_recv_wr* wr, ibv_recv_wr* refused, std::uint32_t recorded,
                                  int error, ibv_recv_wr** bad_wr) {
  // As refuse_send_locked: the receives before the refused one are posted.
  std::uint32_t posted = 0;
  const int result = post_chain_prefix(wr, recorded, bad_wr, &posted,
                                       [&](ibv_recv_wr* copies, ibv_recv_wr** bad) {
                                         return provider->post_recv(app_qp, copies, bad);
                                       });
  recv_ring_.drop_newest(recorded - posted);
  next_recv_to_post_ = recv_ring_.next_position();
  lock_.unlock();
  if (result != 0) return result;
  *bad_wr = refused;
  return error;
}

void VirtualQp::drop_unposted_recvs_locked(ibv_recv_wr* wr, const ibv_recv_wr* bad,
                                           std::uint32_t recorded) {
  std::uint32_t posted = 0;
  for (ibv_recv_wr* w = wr; w != nullptr && w != bad; w = w->next) ++posted;
  recv_ring_.drop_newest(recorded - posted);
}

// Routed: what was recorded before a refused request is posted from the ring (ibv_post_send's
// contract, as refuse_send_locked); a request the ring cannot replay is refused (EOPNOTSUPP): the
// standby that carries the traffic cannot execute it, and a switch under way cannot move it.
int VirtualQp::post_send_routed(ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  int error = 0;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    error = send_ring_.record(*w, sig_all);
    if (error != 0) {
      *bad_wr = w;
      break;
    }
  }
  if (!holding_) post_pending();
  return error == RetransmitRing::kNotReplayable ? EOPNOTSUPP : error;
}

// As post_send_routed.
int VirtualQp::post_recv_routed(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  int error = 0;
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    error = recv_ring_.record(*w);
    if (error != 0) {
      *bad_wr = w;
      break;
    }
  }
  if (!holding_) {
    post_pending();
  } else if (receives_open_) {
    post_pending(false);
  }
  return error;
}

// A request the peer proved done, behind a replayed one (SendRecord::stand_in): a signaled
// zero-length RDMA WRITE names no memory on either side and consumes no receive, and completes
// in order after what precedes it. Its completion gets the request's opcode back.
bool VirtualQp::post_stand_in(const SendRecord& record, int p) {
  ibv_send_wr wr{};
  wr.wr_id = p == kStandby ? record.sequence : record.wr.wr_id;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | (record.wr.send_flags & IBV_SEND_FENCE);
  ibv_send_wr* bad = nullptr;
  const int result = p == kPrimary ? provider->post_send(app_qp, &wr, &bad)
                                   : path[p].qp->context->ops.post_send(path[p].qp, &wr, &bad);
  if (result != 0) {
    VF_LOG_ERROR("qp {}: posting the stand-in of wr_id={:#x} on the {} path failed ({})", vqpn,
                 record.wr.wr_id, p == kPrimary ? "primary" : "standby", result);
    return false;
  }
  return true;
}

bool VirtualQp::post_one_send(const SendRecord& record, int p, bool* missing_key) {
  if (__builtin_expect(record.stand_in, 0)) return post_stand_in(record, p);
  ibv_send_wr wr = record.wr;
  wr.next = nullptr;
  ibv_sge sges[RetransmitRing::kMaxSge];
  const PhysicalPath& target = path[p];
  if (record.inline_length > 0 || (record.wr.send_flags & IBV_SEND_INLINE)) {
    sges[0].addr = reinterpret_cast<std::uintptr_t>(send_ring_.inline_data(record));
    sges[0].length = record.inline_length;
    sges[0].lkey = 0;
    wr.num_sge = record.inline_length > 0 ? 1 : 0;
  } else {
    std::uint32_t missing = 0;
    if (!sges_for_path(p, path[kPrimary].device_index, send_ring_.sges(record), record.num_sge,
                       sges, &missing)) {
      VF_LOG_ERROR("qp {}: lkey {:#x} has no registration on the standby device; request "
                   "wr_id={:#x} cannot be posted there",
                   vqpn, missing, record.wr.wr_id);
      return false;
    }
    wr.num_sge = static_cast<int>(record.num_sge);
  }
  wr.sg_list = sges;
  if (p == kStandby) {
    wr.wr_id = record.sequence;
    // A key that names nothing (a zero-length RDMA's) is not translated: that would fail for
    // good and hold the QP's sends for ever.
    std::uint32_t* rkey = record.remote_key_in(wr, send_ring_.payload_length(record));
    if (rkey != nullptr && !g_services.translate_rkey(peer, *rkey, rkey)) {
      *missing_key = true;
      return false;
    }
  }
  // A replayed request keeps its signaling: unsignaled ones complete with the next signaled.
  if (record.signaled) wr.send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  const int result = p == kPrimary ? provider->post_send(app_qp, &wr, &bad)
                                   : target.qp->context->ops.post_send(target.qp, &wr, &bad);
  if (result != 0) {
    VF_LOG_ERROR("qp {}: posting wr_id={:#x} on the {} path failed ({})", vqpn,
                 record.wr.wr_id, p == kPrimary ? "primary" : "standby", result);
    return false;
  }
  return true;
}

bool VirtualQp::post_one_recv(std::uint64_t position, const ReceiveRecord& record,
                              const ibv_sge* recorded, int p) {
  ibv_sge sges[ReceiveRing::kMaxSge];
  const PhysicalPath& target = path[p];
  std::uint32_t missing = 0;
  if (!sges_for_path(p, path[kPrimary].device_index, recorded, record.num_sge, sges, &missing)) {
    VF_LOG_ERROR("qp {}: receive lkey {:#x} has no registration on the standby device", vqpn,
                 missing);
    return false;
  }
  ibv_recv_wr wr{};
  wr.wr_id = p == kStandby ? (position | kStandbyReceiveTag) : record.wr_id;
  wr.sg_list = sges;
  wr.num_sge = static_cast<int>(record.num_sge);
  ibv_recv_wr* bad = nullptr;
  const int result = p == kPrimary ? provider->post_recv(app_qp, &wr, &bad)
                                   : target.qp->context->ops.post_recv(target.qp, &wr, &bad);
  if (result != 0) {
    VF_LOG_ERROR("qp {}: posting a receive on the {} path failed ({})", vqpn,
                 p == kPrimary ? "primary" : "standby", result);
    return false;
  }
  return true;
}

bool VirtualQp::post_pending(bool sends) {
  const int p = active_path();
  bool ok = true;
  recv_ring_.for_each_from(next_recv_to_post_, [&](std::uint64_t position,
                                                   const ReceiveRecord& record,
                                                   const ibv_sge* sges) {
    if (!ok) return;
    if (!post_one_recv(position, record, sges, p)) {
      ok = false;
      return;
    }
    next_recv_to_post_ = position + 1;
  });
  if (!sends) {
    if (!ok) post_retry_due.store(true, std::memory_order_relaxed);
    return ok;
  }
  bool missing_key = false;
  send_ring_.for_each_from(next_send_to_post_, [&](const SendRecord& record) {
    if (!post_one_send(record, p, &missing_key)) return false;
    next_send_to_post_ = record.sequence + 1;
    return true;
  });
  // Something the path refused stays recorded: the engine's next pass tries again (only then
  // does it take this QP's lock, which costs the application's thread its bias: issue 19 item 11).
  if (!ok || next_send_to_post_ < send_ring_.next_sequence()) {
    post_retry_due.store(true, std::memory_order_relaxed);
  }
  if (missing_key) {
    translation_missing.store(true, std::memory_order_relaxed);
    if (g_services.wake_engine) g_services.wake_engine();
    return false;
  }
  return ok;
}

// ---------------------------------------------------------------- completions

// An error completion of the standby path as the application must see it: its QPN, its wr_id.
void VirtualQp::translate_standby_error(ibv_wc& wc, bool retire) {
  wc.qp_num = vqpn;
  if ((wc.wr_id & kStandbyReceiveTag) && srq != nullptr) {
    std::uint64_t wr_id = 0;
    srq->lock().lock();
    if (srq->application_wr_id(wc.wr_id, &wr_id)) wc.wr_id = wr_id;
    srq->lock().unlock();
  } else if (wc.wr_id & kStandbyReceiveTag) {
    const std::uint64_t position = wc.wr_id & ~kStandbyReceiveTag;
    if (const ReceiveRecord* record = recv_ring_.at(position)) {
      wc.wr_id = record->wr_id;
      // A QP flushes its receives in posting order: older ones are done with too (their flushes
      // may have been held and shown by release_held_errors, which retires nothing).
      if (retire) recv_ring_.retire_through(position);
    }
  } else if (retire) {
    // Failed for good (a QP in ERR flushes whatever is posted to it, for ever): the record, and
    // those before it, are done with; kept, they would fill the ring and make ibv_post_send
    // fail with ENOMEM where the application's own QP in ERR keeps flushing.
    SendRecord record;
    if (send_ring_.retire_sequence(wc.wr_id, record)) wc.wr_id = record.wr.wr_id;
  } else if (const SendRecord* record = send_ring_.find_sequence(wc.wr_id)) {
    // An error retires nothing: the request may still be replayed on the other path.
    wc.wr_id = record->wr.wr_id;
  }
}

bool VirtualQp::on_error_completion(CqState& cq, int p, ibv_wc& wc) {
  const PhysicalPath& other = path[other_path(p)];
  const bool alternative = (other.connected.load(std::memory_order_relaxed) &&
                            !other.failed.load(std::memory_order_relaxed)) ||
                           errors_wait_for_path.load(std::memory_order_relaxed);
  if (is_link_failure(wc.status) && alternative &&
      !application_failed.load(std::memory_order_relaxed)) {
    counters.hidden_error_completions.fetch_add(1, std::memory_order_relaxed);
    // Kept until the switch is done: if it cannot happen, the application gets them after all.
    if (held_errors_.size() < held_errors_.capacity()) {
      HeldError held{&cq, wc, p, wc.wr_id};
      if (p == kStandby) translate_standby_error(held.wc, false);
      held_errors_.push_back(held);
    }
    if (!link_error_seen.exchange(true)) {
      VF_LOG_DEBUG("qp {}: {} completion (status {}, wr_id {:#x}) on the {} path hidden; "
                   "switching paths",
                   vqpn, (wc.opcode & IBV_WC_RECV) ? "receive" : "send", static_cast<int>(wc.status),
                   wc.wr_id, p == kPrimary ? "primary" : "standby");
      if (g_services.wake_engine) g_services.wake_engine();
    }
    return false;
  }
  // The application's own error, or no path left: it gets the completion it would have got,
  // and its QP is failed for good, as without the shim: a path that heals later must not take
  // the traffic back (the replay would repeat, or complete as SUCCESS, work the application has
  // just seen fail). The engine reports it (periodic_work).
  // Only the first error shown tells the engine: flushes that follow an error, or follow the
  // application's own ERR, are that failure's consequences, not a failure of their own.
  const bool first = !application_failed.exchange(true, std::memory_order_relaxed);
  if (first && is_link_failure(wc.status) &&
      !failure_shown.exchange(true, std::memory_order_relaxed) && g_services.wake_engine) {
    g_services.wake_engine();
  }
  if (srq != nullptr && retire_srq_receive_error(cq, p, wc)) return true;
  // Retiring through this record would also retire records whose errors are held (hidden while
  // a switch may still use them): only once none is held (the next flush shown retires them).
  if (p == kStandby) translate_standby_error(wc, held_errors_.empty());
  return true;
}

bool VirtualQp::retire_srq_receive_error(const CqState& cq, int p, ibv_wc& wc) {
  if (p == kStandby) {
    if ((wc.wr_id & kStandbyReceiveTag) == 0) return false;
    // The application gets this receive back: it is no longer the shim's to move.
    wc.qp_num = vqpn;
    srq->lock().lock();
    srq->consume(kStandby, &wc.wr_id, false);
    srq->lock().unlock();
    return true;
  }
  if (!primary_error_is_receive(cq, wc.wr_id)) return false;
  std::uint64_t wr_id = wc.wr_id;
  srq->lock().lock();
  srq->consume(kPrimary, &wr_id, false);
  srq->lock().unlock();
  return false;  // the completion itself is the application's as it is
}

// An error completion's opcode is undefined (rxe reports a flushed receive as IBV_WC_SEND): the
// CQ tells a receive from a request when the QP has two; with one, a request of this wr_id still
// outstanding in the send ring says it is the request's. A pass-through QP records no requests:
// with one CQ its error is nobody's for sure, and its receive is left to be forgotten once later
// receives complete (VirtualSrq::consume).
bool VirtualQp::primary_error_is_receive(const CqState& cq, std::uint64_t wr_id) const {
  if (send_cq != recv_cq) return &cq == recv_cq;
  if (mode_ == PostMode::kBypass) return false;
  bool receive = true;
  send_ring_.for_each_from(0, [&](const SendRecord& record) {
    receive = record.wr.wr_id != wr_id;
    return receive;
  });
  return receive;
}

void VirtualQp::retire_released_srq_receives(const std::vector<HeldError>& released) {
  if (srq == nullptr) return;
  for (const HeldError& held : released) {
    std::uint64_t wr_id = held.raw_wr_id;
    if (held.path == kStandby ? (wr_id & kStandbyReceiveTag) == 0
                              : !primary_error_is_receive(*held.cq, wr_id)) {
      continue;
    }
    srq->lock().lock();
    srq->consume(held.path, &wr_id, false);
    srq->lock().unlock();
  }
}

bool VirtualQp::on_completion_locked(CqState& cq, int p, ibv_wc& wc) {
  if (__builtin_expect(p == kStandby && is_probe_wr_id(wc.wr_id), 0)) {
    // The engine's probe (path_probe.cc), never the application's, whatever path is active.
    record_probe_answer(wc);
    return false;
  }
  if (__builtin_expect(!accepting_[p], 0)) {
    // A path traffic has left: whatever it still reports was drained, replayed or synthesized.
    if (wc.wr_id == kDrainMarkerWrId && wc.status == IBV_WC_WR_FLUSH_ERR) {
      drain_marker_seen_[p] = true;
    } else if (wc.status != IBV_WC_SUCCESS) {
      counters.hidden_error_completions.fetch_add(1, std::memory_order_relaxed);
    }
    return false;
  }
  if (__builtin_expect(wc.status != IBV_WC_SUCCESS, 0)) {
    if (wc.wr_id == kDrainMarkerWrId && wc.status == IBV_WC_WR_FLUSH_ERR) {
      drain_marker_seen_[p] = true;  // the engine's, never the application's
      return false;
    }
    // A standby error is never passed through as it is (its wr_id is the ring's): a QP given up
    // on its standby (srq_group.cc) still gets the standby's late flushes, translated.
    if (mode_ != PostMode::kBypass || p == kStandby) return on_error_completion(cq, p, wc);
    if (srq != nullptr) retire_srq_receive_error(cq, p, wc);
    return true;
  }
  const bool receive = (wc.opcode & IBV_WC_RECV) != 0;
  if (receive && srq != nullptr) {
    // Whatever the mode: the SRQ's record must know every receive its QPs consumed.
    std::uint64_t wr_id = wc.wr_id;
    srq->lock().lock();
    const bool known = srq->consume(p, &wr_id);
    srq->lock().unlock();
    if (p == kStandby) {
      if (!known) {
        VF_LOG_ERROR("qp {}: standby receive completion {:#x} not in its SRQ's record; hidden",
                     vqpn, wc.wr_id);
        return false;
      }
      wc.wr_id = wr_id;
      wc.qp_num = vqpn;
    }
    recv_ring_.note_delivered();
  } else if (p == kPrimary) {
    if (mode_ != PostMode::kBypass) {
      if (receive) {
        recv_ring_.consume_oldest(wc.wr_id);
      } else {
        const SendRecord* retired = send_ring_.retire_next_signaled(wc.wr_id);
        if (__builtin_expect(retired != nullptr && retired->stand_in, 0)) {
          wc.opcode = retired->completion_opcode();
        }
      }
    }
  } else {
    wc.qp_num = vqpn;
    if (receive) {
      const ReceiveRecord* oldest = recv_ring_.oldest();
      if (oldest == nullptr || wc.wr_id != (recv_ring_.oldest_position() | kStandbyReceiveTag)) {
        VF_LOG_ERROR("qp {}: standby receive completion {:#x} out of order; hidden", vqpn,
                     wc.wr_id);
        return false;
      }
      wc.wr_id = oldest->wr_id;
      recv_ring_.consume_oldest(oldest->wr_id);
    } else {
      SendRecord record;
      if (!send_ring_.retire_sequence(wc.wr_id, record)) {
        VF_LOG_ERROR("qp {}: standby send completion {} not in the ring; hidden", vqpn, wc.wr_id);
        return false;
      }
      wc.wr_id = record.wr.wr_id;
      if (record.stand_in) wc.opcode = record.completion_opcode();
    }
  }
  if (__builtin_expect(awaiting_resume.load(std::memory_order_relaxed), 0)) {
    counters.resumed_unix_ns.store(realtime_ns(), std::memory_order_relaxed);
    awaiting_resume.store(false, std::memory_order_relaxed);
  }
  return true;
}

int CqState::poll_physical(int p, int num_entries, ibv_wc* wc, int* raw) {
  ibv_cq* cq = p == kPrimary ? app_cq : shadow;
  const int polled = p == kPrimary ? provider->poll_cq(cq, num_entries, wc)
                                   : cq->context->ops.poll_cq(cq, num_entries, wc);
  if (raw != nullptr) *raw = polled;
  if (polled <= 0) return polled;
  return keep_for_application_locked(p, polled, wc);
}

int CqState::keep_for_application_locked(int p, int polled, ibv_wc* wc) {
  const int device = p == kPrimary ? device_index : shadow_device_index;
  // Completions come in runs of one QP: one lookup and one lock per run, not per completion.
  int kept = 0;
  VirtualQp* qp = nullptr;
  std::uint32_t qpn = 0;
  for (int i = 0; i < polled; ++i) {
    if (i == 0 || wc[i].qp_num != qpn) {
      if (qp != nullptr) qp->lock().unlock();
      qpn = wc[i].qp_num;
      qp = find_virtual_qp_by_qpn(device, qpn);
      if (qp != nullptr) qp->lock().lock();
    }
    // A standby completion nobody owns (its QP was destroyed) is the shim's, never the app's.
    if (qp == nullptr ? p == kStandby : !qp->on_completion_locked(*this, p, wc[i])) continue;
    if (kept != i) wc[kept] = wc[i];
    ++kept;
  }
  if (qp != nullptr) qp->lock().unlock();
  return kept;
}

bool CqState::stash_for_application(const ibv_wc& wc) {
  // The engine's own completions (synthesized, released, flushed) can outnumber the CQ's depth
  // (a whole send queue flushed on each of several QPs): the stash grows, none is lost.
  stash.push(wc);
  stash_nonempty.store(true, std::memory_order_relaxed);
  // An application asleep in ibv_get_cq_event on an armed CQ must learn of it: no device will
  // raise an event for a completion that sits in the stash.
  if (wake_fd >= 0 && notify_armed.exchange(false) && shadow_events.add_due()) {
    eventfd_write(wake_fd, 1);
  }
  return true;
}

// poll()'s path when the stash holds completions or a QP's traffic runs on the shadow.
int CqState::poll_merged_locked(int num_entries, ibv_wc* wc) {
  int total = 0;
  if (__builtin_expect(stash_nonempty.load(std::memory_order_relaxed), 0)) {
    total = stash.pop(num_entries, wc);
    if (stash.size() == 0) stash_nonempty.store(false, std::memory_order_relaxed);
  }
  // A batch the shim hid whole (drain markers, a left path's flushes, replayed requests'
  // completions) says nothing of what follows it in the provider's CQ: each path is polled again
  // while its batches come back full, so that 0 means nothing of the application's is left (an
  // application that re-arms and sleeps on a 0 would strand its completions: issue 19 item 4).
  // Bounded: the shim's own completions in a CQ are finite.
  for (int p = kPrimary; p <= kStandby && total < num_entries; ++p) {
    if (p == kStandby && !shadow_active.load(std::memory_order_relaxed)) break;
    for (;;) {
      const int wanted = num_entries - total;
      int raw = 0;
      const int kept = poll_physical(p, wanted, wc + total, &raw);
      if (kept < 0) {
        if (p == kPrimary && total == 0) {
          lock.unlock();
          return kept;
        }
        break;
      }
      total += kept;
      if (raw < wanted || total == num_entries) break;
    }
  }
  lock.unlock();
  return total;
}

void CqState::drain_into_stash(int p) {
  lock.lock();
  drain_into_stash_locked(p);
  lock.unlock();
}

void CqState::drain_into_stash_locked(int p) {
  ibv_wc batch[kDrainBatch];
  for (;;) {
    if (p == kStandby && shadow == nullptr) break;
    // Every completion polled here is the application's or accounted for by the switch: the old
    // path stops accepting right after, so one left in the provider's CQ would be hidden for good.
    // The stash grows rather than stop early (bounded: the provider's CQ is finite).
    int raw = 0;
    const int kept = poll_physical(p, kDrainBatch, batch, &raw);
    for (int i = 0; i < kept; ++i) stash.push(batch[i]);
    if (raw < kDrainBatch) break;  // the provider's CQ is empty (hidden ones count as polled)
  }
  if (stash.size() > 0) stash_nonempty.store(true, std::memory_order_relaxed);
}

bool CqState::poll_idle_shadow() {
  bool stashed = false;
  ibv_wc batch[kDrainBatch];
  for (;;) {
    const int polled = shadow->context->ops.poll_cq(shadow, kDrainBatch, batch);
    for (int i = 0; i < polled; ++i) {
      if (is_probe_wr_id(batch[i].wr_id)) {
        if (VirtualQp* qp = find_virtual_qp_by_qpn(shadow_device_index, batch[i].qp_num)) {
          qp->record_probe_answer(batch[i]);
        }
        continue;
      }
      // A late completion of a path traffic has left (hidden) or one the application must get:
      // rare, so the locks' cost does not matter here.
      lock.lock();
      if (keep_for_application_locked(kStandby, 1, &batch[i]) == 1) {
        stash.push(batch[i]);
        stash_nonempty.store(true, std::memory_order_relaxed);
        stashed = true;
      }
      lock.unlock();
    }
    if (polled < kDrainBatch) break;
  }
  return stashed;
}

// ---------------------------------------------------------------- ibv_wr_* batches

void VirtualQp::wr_start() {
  batch_.count = 0;
  batch_.overflow = false;
  batch_.direct = mode_ != PostMode::kRouted;  // re-checked under the lock in wr_complete
}

ibv_send_wr* VirtualQp::wr_stage(ibv_wr_opcode opcode, std::uint64_t wr_id, unsigned int flags) {
  if (batch_.count >= batch_.wrs.size()) {
    batch_.overflow = true;
    return nullptr;
  }
  ibv_send_wr& wr = batch_.wrs[batch_.count++];
  wr = ibv_send_wr{};
  wr.opcode = opcode;
  wr.wr_id = wr_id;
  wr.send_flags = flags;
  wr.sg_list = &batch_.sges[(batch_.count - 1) * max_send_sge];
  return &wr;
}

void VirtualQp::wr_stage_sges(std::size_t count, const ibv_sge* sges) {
  if (batch_.count == 0) return;
  ibv_send_wr& wr = batch_.wrs[batch_.count - 1];
  if (count > max_send_sge) {
    batch_.overflow = true;
    return;
  }
  std::memcpy(wr.sg_list, sges, count * sizeof(ibv_sge));
  wr.num_sge = static_cast<int>(count);
}

void VirtualQp::wr_stage_inline(std::size_t count, const ibv_data_buf* bufs) {
  if (batch_.count == 0) return;
  ibv_send_wr& wr = batch_.wrs[batch_.count - 1];
  std::uint8_t* data = batch_.inline_data.data() + (batch_.count - 1) * max_inline;
  std::size_t length = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (length + bufs[i].length > max_inline) {
      batch_.overflow = true;
      return;
    }
    std::memcpy(data + length, bufs[i].addr, bufs[i].length);
    length += bufs[i].length;
  }
  wr.send_flags |= IBV_SEND_INLINE;
  wr.sg_list[0].addr = reinterpret_cast<std::uintptr_t>(data);
  wr.sg_list[0].length = static_cast<std::uint32_t>(length);
  wr.sg_list[0].lkey = 0;
  wr.num_sge = 1;
}

int VirtualQp::wr_begin_complete() {
  lock_.lock();
  batch_.recorded = 0;
  batch_.unreplayable_opcode = -1;
  if (mode_ == PostMode::kBypass) return 0;
  if (mode_ == PostMode::kRouted) return kWrRerouted;
  if (batch_.overflow) {
    batch_.count = 0;
    lock_.unlock();
    return EINVAL;
  }
  for (std::uint32_t i = 0; i < batch_.count; ++i) {
    const int error = send_ring_.record(batch_.wrs[i], sig_all);
    if (error == 0) {
      ++batch_.recorded;
      continue;
    }
    if (error == RetransmitRing::kNotReplayable && may_pass_through_locked()) {
      // The provider's batch holds it: if the provider posts the batch, the QP is pass-through
      // from then on (wr_finish).
      batch_.unreplayable_opcode = static_cast<int>(batch_.wrs[i].opcode);
      return 0;
    }
    // ibv_wr_complete posts the whole batch or none of it (mlx5, rxe).
    send_ring_.drop_newest(i);
    const ibv_wr_opcode opcode = batch_.wrs[i].opcode;
    batch_.count = 0;
    lock_.unlock();
    if (error != RetransmitRing::kNotReplayable) return error;
    log_refused_opcode(opcode);
    return EOPNOTSUPP;
  }
  return 0;
}

void VirtualQp::wr_finish(int provider_result) {
  if (mode_ != PostMode::kBypass) {
    if (provider_result != 0) {
      send_ring_.drop_newest(batch_.recorded);
    } else if (batch_.unreplayable_opcode >= 0) {
      become_pass_through_locked(static_cast<ibv_wr_opcode>(batch_.unreplayable_opcode));
    }
    next_send_to_post_ = send_ring_.next_sequence();
  }
  batch_.count = 0;
  lock_.unlock();
}

int VirtualQp::wr_complete_routed() {
  lock_.lock();
  return wr_complete_routed_locked();
}

int VirtualQp::wr_complete_routed_locked() {
  // ibv_wr_complete posts the whole batch or none of it (mlx5, rxe).
  int result = batch_.overflow ? EINVAL : 0;
  std::uint32_t recorded = 0;
  ibv_wr_opcode refused = IBV_WR_SEND;
  while (result == 0 && recorded < batch_.count) {
    result = send_ring_.record(batch_.wrs[recorded], sig_all);
    if (result == 0) ++recorded;
  }
  if (result == RetransmitRing::kNotReplayable) {
    refused = batch_.wrs[recorded].opcode;
    result = EOPNOTSUPP;
  }
  if (result != 0) {
    send_ring_.drop_newest(recorded);
  } else if (!holding_) {
    post_pending();
  }
  batch_.count = 0;
  lock_.unlock();
  if (result == EOPNOTSUPP) log_refused_opcode(refused);
  return result;
}

void VirtualQp::wr_abort() { batch_.count = 0; }

}  // namespace vf
