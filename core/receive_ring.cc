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

bool ReceiveRing::consume_oldest(std::uint64_t wr_id) {
  if (head_ == tail_ || records_[slot_of(head_)].wr_id != wr_id) return false;
  ++head_;
  ++delivered_;
  return true;
}

}  // namespace vf
