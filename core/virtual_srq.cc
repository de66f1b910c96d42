// The record of a shared receive queue's receives and where they are posted (core/virtual_srq.h,
// docs/design.md §5i). Healthy: record, then the provider's own post with the application's
// request, as for a QP's receives. On the standby, and when receives move, each is posted from
// the record with the standby device's keys.

#include "core/virtual_srq.h"

#include <errno.h>

#include <algorithm>
#include <bit>

#include "core/log.h"
#include "core/virtual_qp.h"

namespace vf {

VirtualSrq::VirtualSrq(ibv_srq* srq, const ibv_context_ops* ops, std::uint32_t depth,
                       std::uint32_t sge, int device)
    : app_srq(srq),
      provider(ops),
      device_index(device),
      max_wr(std::max<std::uint32_t>(depth, 1)),
      max_sge(std::clamp<std::uint32_t>(sge, 1, kMaxSge)),
      capacity_(std::min(std::bit_ceil(max_wr * kSlack), kMaxCapacity)),
      mask_(capacity_ - 1),
      sge_stride_(max_sge),
      records_(capacity_),
      sges_(static_cast<std::size_t>(capacity_) * max_sge) {}

int VirtualSrq::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (__builtin_expect(pinned_.load(std::memory_order_relaxed), 0)) {
    return provider->post_srq_recv(app_srq, wr, bad_wr);
  }
  lock_.lock();
  if (__builtin_expect(pinned_.load(std::memory_order_relaxed), 0)) {
    lock_.unlock();
    return provider->post_srq_recv(app_srq, wr, bad_wr);
  }
  const std::uint64_t first = tail_;
  const int path = active_.load(std::memory_order_relaxed);
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    int error = 0;
    if (tail_ - head_ >= capacity_) forget_taken_at_head();
    if (tail_ - head_ >= capacity_) error = ENOMEM;
    if (w->num_sge < 0 || static_cast<std::uint32_t>(w->num_sge) > max_sge) error = EINVAL;
    if (__builtin_expect(error != 0, 0)) {
      for (std::uint64_t p = first; p < tail_; ++p) --outstanding_;
      tail_ = first;
      lock_.unlock();
      *bad_wr = w;
      return error;
    }
    const std::uint32_t slot = slot_of(tail_);
    records_[slot] = Record{w->wr_id, static_cast<std::uint32_t>(w->num_sge),
                            static_cast<std::int8_t>(holding_ ? -1 : path), false, false};
    std::copy_n(w->sg_list, w->num_sge, &sges_[static_cast<std::size_t>(slot) * sge_stride_]);
    ++tail_;
    ++outstanding_;
  }
  if (holding_) {
    lock_.unlock();
    return 0;
  }
  if (__builtin_expect(path == kPrimary, 1)) {
    const int result = provider->post_srq_recv(app_srq, wr, bad_wr);
    if (__builtin_expect(result != 0, 0)) {
      std::uint64_t posted = 0;
      for (ibv_recv_wr* w = wr; w != nullptr && w != *bad_wr; ++posted, w = w->next) {
      }
      while (tail_ > first + posted) {
        --tail_;
        --outstanding_;
      }
    }
    lock_.unlock();
    return result;
  }
  // The standby carries the traffic: each from the record, with its keys.
  ibv_recv_wr* w = wr;
  for (std::uint64_t position = first; position < tail_; ++position, w = w->next) {
    if (!post_one(position, path)) {
      const std::uint64_t end = tail_;
      for (std::uint64_t p = position; p < end; ++p) --outstanding_;
      tail_ = position;
      lock_.unlock();
      *bad_wr = w;
      return ENOMEM;
    }
  }
  lock_.unlock();
  return 0;
}

bool VirtualSrq::post_one(std::uint64_t position, int path) {
  Record& record = records_[slot_of(position)];
  ibv_sge sges[kMaxSge];
  const ibv_sge* recorded = &sges_[static_cast<std::size_t>(slot_of(position)) * sge_stride_];
  std::uint32_t missing = 0;
  if (!sges_for_path(path, device_index, recorded, record.num_sge, sges, &missing)) {
    VF_LOG_ERROR("srq {:#x}: receive lkey {:#x} has no registration on the standby device",
                 app_srq->handle, missing);
    return false;
  }
  ibv_recv_wr wr{};
  wr.wr_id = path == kStandby ? (position | kStandbyReceiveTag) : record.wr_id;
  wr.sg_list = sges;
  wr.num_sge = static_cast<int>(record.num_sge);
  ibv_recv_wr* bad = nullptr;
  const int result = path == kPrimary ? provider->post_srq_recv(app_srq, &wr, &bad)
                                      : shadow->context->ops.post_srq_recv(shadow, &wr, &bad);
  if (result != 0) {
    VF_LOG_ERROR("srq {:#x}: posting a receive on the {} SRQ failed ({})", app_srq->handle,
                 path == kPrimary ? "primary" : "standby", result);
    return false;
  }
  record.where = static_cast<std::int8_t>(path);
  return true;
}

void VirtualSrq::retire(std::uint64_t position, bool succeeded) {
  if (succeeded) mark_taken_before(position, records_[slot_of(position)].where);
  records_[slot_of(position)].consumed = true;
  --outstanding_;
  while (head_ < tail_ && records_[slot_of(head_)].consumed) ++head_;
}

void VirtualSrq::mark_taken_before(std::uint64_t position, int path) {
  if (path != kPrimary && path != kStandby) return;
  for (std::uint64_t p = std::max(scan_[path], head_); p < position; ++p) {
    Record& record = records_[slot_of(p)];
    if (!record.consumed && record.where == path) record.taken = true;
  }
  scan_[path] = std::max(scan_[path], position + 1);
}

void VirtualSrq::forget_taken_at_head() {
  std::uint64_t forgotten = 0;
  while (head_ < tail_) {
    Record& record = records_[slot_of(head_)];
    if (!record.consumed && !record.taken) break;
    if (!record.consumed) {
      record.consumed = true;
      if (record.where == kStandby) {
        forgotten_standby_[forgotten_next_++ % kForgottenKept] = {head_, record.wr_id, true};
      }
      --outstanding_;
      ++forgotten;
    }
    ++head_;
  }
  if (forgotten != 0 && (forgotten_ == 0 || std::has_single_bit(forgotten_ + forgotten))) {
    VF_LOG_INFO("srq {:#x}: {} receive(s) taken by a QP and never completed (their QP was "
                "destroyed, or their completion went by unseen) are forgotten ({} so far)",
                app_srq->handle, forgotten, forgotten_ + forgotten);
  }
  forgotten_ += forgotten;
}

bool VirtualSrq::consume(int path, std::uint64_t* wr_id, bool succeeded) {
  if (pinned_.load(std::memory_order_relaxed)) return false;
  if (path == kStandby) {
    if ((*wr_id & kStandbyReceiveTag) == 0) return false;
    const std::uint64_t position = *wr_id & ~kStandbyReceiveTag;
    if (position < head_) {
      const int entry = forgotten_entry(position);
      if (entry < 0) return false;
      *wr_id = forgotten_standby_[entry].wr_id;
      forgotten_standby_[entry].live = false;  // translated once
      return true;
    }
    if (position < head_ || position >= tail_) return false;
    const Record& record = records_[slot_of(position)];
    if (record.consumed || record.where != kStandby) return false;
    *wr_id = record.wr_id;
    retire(position, succeeded);
    return true;
  }
  for (std::uint64_t position = head_; position < tail_; ++position) {
    const Record& record = records_[slot_of(position)];
    if (!record.consumed && record.where == kPrimary && record.wr_id == *wr_id) {
      retire(position, succeeded);
      return true;
    }
  }
  return false;
}

bool VirtualSrq::application_wr_id(std::uint64_t tagged, std::uint64_t* wr_id) const {
  if ((tagged & kStandbyReceiveTag) == 0) return false;
  const std::uint64_t position = tagged & ~kStandbyReceiveTag;
  if (position < head_) {
    const int entry = forgotten_entry(position);
    if (entry >= 0) *wr_id = forgotten_standby_[entry].wr_id;
    return entry >= 0;
  }
  if (position >= tail_) return false;
  *wr_id = records_[slot_of(position)].wr_id;
  return true;
}

int VirtualSrq::forgotten_entry(std::uint64_t position) const {
  for (std::size_t i = 0; i < kForgottenKept; ++i) {
    if (forgotten_standby_[i].live && forgotten_standby_[i].position == position) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

void VirtualSrq::set_holding(bool on) {
  lock_.lock();
  holding_ = on;
  lock_.unlock();
}

int VirtualSrq::move_to(int path) {
  lock_.lock();
  int moved = 0;
  bool ok = true;
  for (std::uint64_t position = head_; position < tail_ && ok; ++position) {
    Record& record = records_[slot_of(position)];
    if (record.consumed) continue;
    // Re-posted whether taken or not: a receive in a QP's hands when the move began was flushed
    // by that QP's drain (hidden), and the application still counts it as posted.
    record.where = -1;
    record.taken = false;
    if (post_one(position, path)) {
      ++moved;
    } else {
      ok = false;
    }
  }
  active_.store(path, std::memory_order_relaxed);
  // The path's SRQ now holds the re-posted receives in position order: start the order afresh.
  scan_[path] = head_;
  holding_ = false;
  lock_.unlock();
  return ok ? moved : -1;
}

void VirtualSrq::pin_to_primary() {
  lock_.lock();
  pinned_.store(true, std::memory_order_relaxed);
  holding_ = false;
  lock_.unlock();
}

}  // namespace vf
