// The receive side of exactly-once failover (docs/design.md §5): the receives a protected QP (or
// SRQ) has posted, in order, and how many receive-consuming messages it has delivered to the
// application. After a failover the count goes to the peer (which replays exactly the messages
// after it) and the receives still pending are posted again, in order, on the standby path.
#pragma once

#include <errno.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace vf {

struct ReceiveRecord {
  std::uint64_t wr_id = 0;
  std::uint32_t num_sge = 0;
};

class ReceiveRing {
 public:
  static constexpr std::uint32_t kMaxCapacity = 1u << 16;
  static constexpr std::uint32_t kMaxSge = 32;

  ReceiveRing(std::uint32_t capacity, std::uint32_t max_sge);

  // 0, ENOMEM when full (the receive queue is), EINVAL beyond the SGE limit. Inline: it runs
  // inside every ibv_post_recv of a protected QP.
  [[gnu::always_inline]] int record(const ibv_recv_wr& wr) {
    if (__builtin_expect(pending() >= capacity_, 0)) return ENOMEM;
    // NCCL posts receives with num_sge = 0 (RDMA_WRITE_WITH_IMM carries no payload to them).
    const int num_sge = wr.num_sge;
    if (__builtin_expect(num_sge < 0 || static_cast<std::uint32_t>(num_sge) > max_sge_, 0)) {
      return EINVAL;
    }
    const std::uint32_t slot = slot_of(tail_);
    records_[slot] = {wr.wr_id, static_cast<std::uint32_t>(num_sge)};
    ibv_sge* sge = &sge_storage_[static_cast<std::size_t>(slot) * max_sge_];
    for (int i = 0; i < num_sge; ++i) sge[i] = wr.sg_list[i];
    ++tail_;
    return 0;
  }

  // A successful receive completion reached the application: RC consumes receives in posting
  // order, so it is the oldest pending one. Returns false when nothing was pending (a completion
  // the ring did not expect: the caller logs it and treats the QP as unprotected).
  bool consume_oldest(std::uint64_t wr_id);

  // The receive at `position` and every older one are finished without a message (flushed: the
  // QP is failed for good, and a receive queue flushes in posting order). Not counted as
  // delivered. False when nothing is pending at that position.
  bool retire_through(std::uint64_t position) {
    if (at(position) == nullptr) return false;
    head_ = position + 1;
    return true;
  }

  // The oldest pending receive (its position numbers it on a path that carries the position as
  // wr_id), or nullptr.
  const ReceiveRecord* oldest() const { return head_ == tail_ ? nullptr : &records_[slot_of(head_)]; }
  std::uint64_t oldest_position() const { return head_; }
  // The pending receive at this position, or nullptr.
  const ReceiveRecord* at(std::uint64_t position) const {
    return position >= head_ && position < tail_ ? &records_[slot_of(position)] : nullptr;
  }
  std::uint64_t next_position() const { return tail_; }
  // Undoes the newest `count` records (the provider refused them).
  void drop_newest(std::uint32_t count) {
    while (count-- > 0 && tail_ > head_) --tail_;
  }
  // Visits pending receives with position >= from, oldest first (position, record, sges).
  template <typename Visit>
  void for_each_from(std::uint64_t from, Visit&& visit) const {
    for (std::uint64_t position = std::max(from, head_); position < tail_; ++position) {
      const std::uint32_t slot = slot_of(position);
      visit(position, records_[slot], &sge_storage_[static_cast<std::size_t>(slot) * max_sge_]);
    }
  }
  std::uint64_t delivered_messages() const { return delivered_; }
  // A message consumed a receive of the QP's shared receive queue (which keeps that receive).
  void note_delivered() { ++delivered_; }
  std::uint32_t pending() const { return static_cast<std::uint32_t>(tail_ - head_); }

  // The pending receives, oldest first, to post again on the standby path.
  template <typename Visit>
  void for_each_pending(Visit&& visit) const {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      const std::uint32_t slot = slot_of(position);
      visit(records_[slot], &sge_storage_[static_cast<std::size_t>(slot) * max_sge_]);
    }
  }

 private:
  std::uint32_t slot_of(std::uint64_t position) const {
    return static_cast<std::uint32_t>(position & mask_);
  }

  std::uint32_t capacity_;  // the receive queue's depth
  std::uint32_t mask_;      // slots (capacity_ rounded up to a power of two) - 1
  std::uint32_t max_sge_;
  std::vector<ReceiveRecord> records_;
  std::vector<ibv_sge> sge_storage_;
  std::uint64_t head_ = 0;
  std::uint64_t tail_ = 0;
  std::uint64_t delivered_ = 0;
};

}  // namespace vf
