// A position of a single-producer single-consumer ring: written by one side, read by both.
//
// Why: a protected QP's rings are filled under the QP's lock (posting) and emptied under the
// lock of the CQ its completions arrive on (polling). Those are different locks, so the two
// sides publish their positions to each other instead of sharing a third lock — the healthy
// poll then takes one lock (the CQ's), not two (docs/design.md §5b). A release store after the
// slots are written and an acquire load before they are read are plain moves on x86: the
// owner's advance is a load and a store, never a locked read-modify-write.
#pragma once

#include <atomic>
#include <cstdint>

namespace vf {

class RingIndex {
 public:
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                "a ring position must be a plain atomic word");

  std::uint64_t get() const noexcept { return value_.load(std::memory_order_acquire); }
  // Only the side that owns this position writes it.
  void set(std::uint64_t value) noexcept { value_.store(value, std::memory_order_release); }
  void advance() noexcept { set(value_.load(std::memory_order_relaxed) + 1); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

}  // namespace vf
