#include "core/retransmit_ring.h"

#include <algorithm>
#include <bit>

namespace vf {

bool SendRecord::is_atomic() const {
  return wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

ibv_wc_opcode SendRecord::completion_opcode() const {
  switch (wr.opcode) {
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

std::uint32_t* SendRecord::remote_key_in(ibv_send_wr& post, std::uint64_t payload_length) const {
  switch (wr.opcode) {
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return &post.wr.atomic.rkey;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      return payload_length > 0 ? &post.wr.rdma.rkey : nullptr;
    default:
      return nullptr;
  }
}

RetransmitRing::RetransmitRing(std::uint32_t capacity, std::uint32_t max_sge,
                               std::uint32_t max_inline)
    : capacity_(std::clamp<std::uint32_t>(capacity, 1, kMaxCapacity)),
      slots_(std::bit_ceil(capacity_)),
      mask_(slots_ - 1),
      max_sge_(std::clamp<std::uint32_t>(max_sge, 1, kMaxSge)),
      max_inline_(max_inline),
      records_(slots_),
      sge_storage_(static_cast<std::size_t>(slots_) * max_sge_),
      inline_storage_(static_cast<std::size_t>(slots_) * max_inline_),
      signaled_(slots_) {}

void RetransmitRing::drop_newest(std::uint32_t count) {
  while (count-- > 0 && tail_ > head_) {
    --tail_;
    --next_sequence_;
    if (sig_tail_ > sig_head_ && signaled_[(sig_tail_ - 1) & mask_] == tail_) --sig_tail_;
    if (records_[slot_of(tail_)].consumes_receive()) --messages_posted_;
  }
}

const SendRecord* RetransmitRing::retire_next_signaled(std::uint64_t wr_id) {
  if (sig_head_ == sig_tail_) return nullptr;
  const std::uint64_t position = signaled_[sig_head_ & mask_];
  const SendRecord& entry = records_[slot_of(position)];
  if (entry.wr.wr_id != wr_id) return nullptr;
  head_ = position + 1;
  ++sig_head_;
  return &entry;
}

bool RetransmitRing::retire_sequence(std::uint64_t sequence, SendRecord& out) {
  for (std::uint64_t position = head_; position < tail_; ++position) {
    const SendRecord& entry = records_[slot_of(position)];
    if (entry.sequence < sequence) continue;
    if (entry.sequence != sequence) return false;
    out = entry;
    head_ = position + 1;
    drop_retired_signaled();
    return true;
  }
  return false;
}

void RetransmitRing::move_slot(std::uint32_t from, std::uint32_t to) {
  records_[to] = records_[from];
  std::copy_n(&sge_storage_[static_cast<std::size_t>(from) * max_sge_], max_sge_,
              &sge_storage_[static_cast<std::size_t>(to) * max_sge_]);
  if (max_inline_ > 0) {
    std::copy_n(&inline_storage_[static_cast<std::size_t>(from) * max_inline_], max_inline_,
                &inline_storage_[static_cast<std::size_t>(to) * max_inline_]);
  }
}

void RetransmitRing::retire_through(std::uint64_t sequence) {
  while (head_ < tail_ && records_[slot_of(head_)].sequence <= sequence) ++head_;
  drop_retired_signaled();
}

bool RetransmitRing::replay_set(std::uint64_t delivered_messages,
                                std::vector<const SendRecord*>& replay,
                                std::vector<const SendRecord*>& unrecoverable) const {
  replay.clear();
  unrecoverable.clear();
  if (delivered_messages > messages_posted_) return false;
  for (std::uint64_t position = head_; position < tail_; ++position) {
    const SendRecord& entry = records_[slot_of(position)];
    if (entry.is_atomic()) {
      unrecoverable.push_back(&entry);
    } else if (entry.wr.opcode == IBV_WR_RDMA_READ) {
      replay.push_back(&entry);
    } else if (entry.consumes_receive() ? entry.message_index > delivered_messages
                                        : entry.message_index >= delivered_messages) {
      replay.push_back(&entry);
    }
  }
  return true;
}

const ibv_sge* RetransmitRing::sges(const SendRecord& record) const {
  const auto slot = static_cast<std::size_t>(&record - records_.data());
  return &sge_storage_[slot * max_sge_];
}

const std::uint8_t* RetransmitRing::inline_data(const SendRecord& record) const {
  const auto slot = static_cast<std::size_t>(&record - records_.data());
  return &inline_storage_[slot * max_inline_];
}

std::uint64_t RetransmitRing::payload_length(const SendRecord& record) const {
  if (record.inline_length > 0 || (record.wr.send_flags & IBV_SEND_INLINE)) {
    return record.inline_length;
  }
  const ibv_sge* list = sges(record);
  std::uint64_t length = 0;
  for (std::uint32_t i = 0; i < record.num_sge; ++i) length += list[i].length;
  return length;
}

}  // namespace vf
