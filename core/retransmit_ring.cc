#include "core/retransmit_ring.h"

#include <errno.h>

#include <algorithm>
#include <cstring>

namespace vf {

bool SendRecord::consumes_receive() const {
  return wr.opcode == IBV_WR_SEND || wr.opcode == IBV_WR_SEND_WITH_IMM ||
         wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr.opcode == IBV_WR_SEND_WITH_INV;
}

bool SendRecord::is_atomic() const {
  return wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

RetransmitRing::RetransmitRing(std::uint32_t capacity, std::uint32_t max_sge,
                               std::uint32_t max_inline)
    : capacity_(std::clamp<std::uint32_t>(capacity, 1, kMaxCapacity)),
      max_sge_(std::clamp<std::uint32_t>(max_sge, 1, kMaxSge)),
      max_inline_(max_inline),
      records_(capacity_),
      sge_storage_(static_cast<std::size_t>(capacity_) * max_sge_),
      inline_storage_(static_cast<std::size_t>(capacity_) * max_inline_) {}

int RetransmitRing::record(const ibv_send_wr& wr) {
  if (outstanding() >= capacity_) return ENOMEM;
  const bool is_inline = (wr.send_flags & IBV_SEND_INLINE) != 0;
  if (wr.num_sge < 0 || static_cast<std::uint32_t>(wr.num_sge) > max_sge_) return EINVAL;
  std::uint64_t inline_length = 0;
  for (int i = 0; i < wr.num_sge; ++i) inline_length += wr.sg_list[i].length;
  if (is_inline && inline_length > max_inline_) return EINVAL;

  const std::uint32_t slot = slot_of(tail_);
  SendRecord& entry = records_[slot];
  entry.sequence = next_sequence_;
  entry.wr = wr;
  entry.wr.next = nullptr;
  entry.wr.sg_list = nullptr;
  entry.num_sge = static_cast<std::uint32_t>(wr.num_sge);
  entry.inline_length = 0;
  ibv_sge* sge = &sge_storage_[static_cast<std::size_t>(slot) * max_sge_];
  std::copy_n(wr.sg_list, wr.num_sge, sge);
  if (is_inline) {
    std::uint8_t* data = &inline_storage_[static_cast<std::size_t>(slot) * max_inline_];
    for (int i = 0; i < wr.num_sge; ++i) {
      std::memcpy(data + entry.inline_length,
                  reinterpret_cast<const void*>(static_cast<std::uintptr_t>(wr.sg_list[i].addr)),
                  wr.sg_list[i].length);
      entry.inline_length += wr.sg_list[i].length;
    }
  }
  if (entry.consumes_receive()) ++messages_posted_;
  entry.message_index = messages_posted_;
  ++next_sequence_;
  ++tail_;
  return 0;
}

void RetransmitRing::retire_through(std::uint64_t sequence) {
  while (head_ < tail_ && records_[slot_of(head_)].sequence <= sequence) ++head_;
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

}  // namespace vf
