// The completion events a CQ's shadow (and its stash) owes the application's channel, counted
// per CQ: "due" (announced on the channel's wake eventfd, not yet handed out by
// ibv_get_cq_event) and "unacked" (handed out, not yet acknowledged by ibv_ack_cq_events).
//
// Why one word: ibv_destroy_cq must stop new hand-outs, then wait for the handed-out events'
// acknowledgements (as libibverbs waits for the real CQ's). With two counters a hand-out that
// had taken a due event but not yet counted it as unacked slipped between the two steps, and
// the application then held an event of a destroyed CQ. Here a hand-out moves an event from due
// to unacked in one compare-exchange, and closing clears due and bars new ones in one more.
#pragma once

#include <atomic>
#include <cstdint>

namespace vf {

class ShadowEvents {
 public:
  // One more event due (the engine announces it on the wake eventfd right after). False once
  // closed: nothing is announced.
  bool add_due() {
    std::uint64_t word = word_.load();
    do {
      if (word & kClosed) return false;
    } while (!word_.compare_exchange_weak(word, word + 1));
    return true;
  }

  // ibv_get_cq_event: takes one due event as handed out. False when none is due.
  bool hand_out() {
    std::uint64_t word = word_.load();
    do {
      if (due(word) == 0) return false;
    } while (!word_.compare_exchange_weak(word, word - 1 + kOneUnacked));
    return true;
  }

  // ibv_ack_cq_events(n): how many of the n were this CQ's shadow events (the rest are the real
  // CQ's, for libibverbs to count).
  std::uint32_t acknowledge(std::uint32_t n) {
    std::uint64_t word = word_.load();
    std::uint32_t taken = 0;
    do {
      taken = unacked(word) < n ? unacked(word) : n;
    } while (!word_.compare_exchange_weak(word, word - taken * kOneUnacked));
    if (taken > 0) word_.notify_all();  // a destroy may wait for it
    return taken;
  }

  // ibv_destroy_cq, once the destroy will go through: no event is handed out or announced any
  // more. Returns how many were due (their eventfd tokens are the caller's to take back).
  // One compare-exchange, so that no hand-out falls between the close and the clearing.
  std::uint32_t close() {
    std::uint64_t word = word_.load();
    do {
      if (word & kClosed) return 0;
    } while (!word_.compare_exchange_weak(word, (word & ~kDueMask) | kClosed));
    return due(word);
  }

  // After close(): returns once every handed-out event was acknowledged.
  void wait_acknowledged() {
    for (std::uint64_t word = word_.load(); unacked(word) != 0; word = word_.load()) {
      word_.wait(word);
    }
  }

  std::uint32_t due() const { return due(word_.load()); }
  std::uint32_t unacked() const { return unacked(word_.load()); }

 private:
  // due in bits 0-30, closed in bit 31, unacked in bits 32-63
  static constexpr std::uint64_t kDueMask = (1ull << 31) - 1;
  static constexpr std::uint64_t kClosed = 1ull << 31;
  static constexpr std::uint64_t kOneUnacked = 1ull << 32;
  static std::uint32_t due(std::uint64_t word) { return static_cast<std::uint32_t>(word & kDueMask); }
  static std::uint32_t unacked(std::uint64_t word) {
    return static_cast<std::uint32_t>(word >> 32);
  }

  std::atomic<std::uint64_t> word_{0};
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "ShadowEvents relies on one lock-free 64-bit word");

}  // namespace vf
