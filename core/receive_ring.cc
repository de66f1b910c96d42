#include "core/receive_ring.h"

#include <errno.h>

#include <algorithm>
#include <bit>

namespace vf {

ReceiveRing::ReceiveRing(std::uint32_t capacity, std::uint32_t max_sge)
    : capacity_(std::clamp<std::uint32_t>(capacity, 1, kMaxCapacity)),
      mask_(std::bit_ceil(capacity_) - 1),
      max_sge_(std::clamp<std::uint32_t>(max_sge, 1, kMaxSge)),
      records_(mask_ + 1),
      sge_storage_(static_cast<std::size_t>(mask_ + 1) * max_sge_) {}

int ReceiveRing::record(const ibv_recv_wr& wr) {
  if (pending() >= capacity_) return ENOMEM;
  // NCCL posts receives with num_sge = 0 (RDMA_WRITE_WITH_IMM carries no payload to them).
  if (wr.num_sge < 0 || static_cast<std::uint32_t>(wr.num_sge) > max_sge_) return EINVAL;
  const std::uint32_t slot = slot_of(tail_);
  records_[slot] = {wr.wr_id, static_cast<std::uint32_t>(wr.num_sge)};
  std::copy_n(wr.sg_list, wr.num_sge, &sge_storage_[static_cast<std::size_t>(slot) * max_sge_]);
  ++tail_;
  return 0;
}

bool ReceiveRing::consume_oldest(std::uint64_t wr_id) {
  if (head_ == tail_ || records_[slot_of(head_)].wr_id != wr_id) return false;
  ++head_;
  ++delivered_;
  return true;
}

}  // namespace vf
