// A shared receive queue seen as a pair of physical SRQs (docs/design.md §5i): the
// application's own on its device and a shadow on the backup device. Its receives are shared by
// every QP attached to it, so the SRQ cannot follow one QP: all its protected QPs switch paths
// together, and the receives move with them. This record keeps every receive the application
// posted until a completion proves it consumed, in posting order, so a move re-posts exactly
// the ones still unconsumed on the other SRQ.
//
// Wire identity of a receive: on the application's SRQ it carries the application's wr_id (so
// a QP the shim does not track still sees its own wr_ids); a completion there retires the oldest
// unconsumed receive with that wr_id (SRQs hand out receives in posting order; an application
// that gives two outstanding receives one wr_id cannot tell them apart either). On the shadow it
// carries kStandbyReceiveTag | its position, like a standby QP's own receives.
//
// Locking: its own SpinLock, taken inside a VirtualQp's lock (order CQ -> QP -> SRQ), never
// shared with another SRQ or QP.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "core/spin_lock.h"

namespace vf {

class VirtualSrq {
 public:
  static constexpr std::uint32_t kMaxSge = 32;
  static constexpr std::uint32_t kMaxCapacity = 1u << 18;
  // Room for receives consumed on the wire whose completion the application has not polled
  // yet (they are still "outstanding" here): four times the SRQ's depth.
  static constexpr std::uint32_t kSlack = 4;
  static_assert((kMaxCapacity & (kMaxCapacity - 1)) == 0, "positions index a power-of-two ring");

  VirtualSrq(ibv_srq* srq, const ibv_context_ops* provider, std::uint32_t max_wr,
             std::uint32_t max_sge, int device_index);

  // ---- data path (application threads) ----
  int post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

  // Under lock(): a receive completion of an attached QP on `path`, shown to the application
  // (success or error: either way the receive left the SRQ for good). Primary: retires the
  // oldest unconsumed receive with this wr_id. Standby: *wr_id is the tagged position; it
  // becomes the application's wr_id. False: not a receive this record knows (left as it is).
  // Receives posted on that path before the one retired have left the SRQ too (an SRQ hands
  // them out in posting order): they are marked taken, and when the record is full those at its
  // head are forgotten (their QP was destroyed, or their completion went by unseen).
  // An error (succeeded false) retires its receive only: it may be a request's flush of the same
  // wr_id, and says nothing of the SRQ's order. A standby receive forgotten while in fact still
  // in a QP's hands is still translated (once) until its slot is used again.
  bool consume(int path, std::uint64_t* wr_id, bool succeeded = true);
  // Under lock(): the application's wr_id of a tagged standby receive (error completions).
  bool application_wr_id(std::uint64_t tagged, std::uint64_t* wr_id) const;

  // ---- engine (its thread) ----
  SpinLock& lock() { return lock_; }
  int active_path() const { return active_.load(std::memory_order_relaxed); }
  // While holding, posts are recorded and reach no SRQ (a move is under way).
  void set_holding(bool on);
  // Posts every unconsumed receive, oldest first, on `path`'s SRQ, which becomes the active one.
  // Returns how many; -1 when the provider refused one (the rest stay recorded, unposted).
  int move_to(int path);
  // Stop recording for good (a QP the shim cannot track uses the SRQ): posts go straight to the
  // application's SRQ; nothing recorded is posted again.
  void pin_to_primary();
  bool pinned() const { return pinned_.load(std::memory_order_relaxed); }
  std::uint32_t outstanding() const { return outstanding_; }
  std::uint64_t forgotten() const { return forgotten_; }

  ibv_srq* const app_srq;
  const ibv_context_ops* const provider;
  const int device_index;
  const std::uint32_t max_wr;
  const std::uint32_t max_sge;
  ibv_srq* shadow = nullptr;  // on the backup device, created with the first protected QP
  int shadow_device_index = -1;
  // A path's SRQ may still hold receives that moved away from it (SRQs are never flushed): it
  // is swept before receives are posted there again.
  bool may_hold_stale[2] = {false, false};

 private:
  struct Record {
    std::uint64_t wr_id = 0;
    std::uint32_t num_sge = 0;
    std::int8_t where = -1;  // the path whose SRQ holds it, -1 while held
    bool consumed = false;
    // A later receive posted on the same path completed: this one has left the SRQ as well (in
    // a QP's hands, its completion still to come, or lost with that QP).
    bool taken = false;
  };
  // Standby receives forgotten lately, with their wr_id: one may have been in a QP's hands
  // after all (a long message while many short ones completed), and its completion is still
  // translated, once. A full record reuses the forgotten receive's slot at once, hence this.
  struct ForgottenStandby {
    std::uint64_t position = 0;
    std::uint64_t wr_id = 0;
    bool live = false;
  };
  static constexpr std::size_t kForgottenKept = 64;
  // The entry of a forgotten standby receive at this position still to be translated, or -1.
  int forgotten_entry(std::uint64_t position) const;
  std::uint32_t slot_of(std::uint64_t position) const {
    return static_cast<std::uint32_t>(position & mask_);
  }
  bool post_one(std::uint64_t position, int path);
  void retire(std::uint64_t position, bool succeeded);

  void mark_taken_before(std::uint64_t position, int path);
  void forget_taken_at_head();

  SpinLock lock_;
  std::atomic<int> active_{0};
  std::atomic<bool> pinned_{false};
  bool holding_ = false;
  std::uint32_t capacity_;
  std::uint32_t mask_;
  std::uint32_t sge_stride_;
  std::vector<Record> records_;
  std::vector<ibv_sge> sges_;
  std::uint64_t head_ = 0;  // oldest record not yet retired
  std::uint64_t tail_ = 0;
  std::uint32_t outstanding_ = 0;  // recorded, not consumed
  std::uint64_t forgotten_ = 0;    // taken receives dropped from a full record
  std::array<ForgottenStandby, kForgottenKept> forgotten_standby_{};
  std::size_t forgotten_next_ = 0;
  // Per path: receives before this position were already checked by mark_taken_before (each is
  // checked once: a completion costs O(1) amortized).
  std::uint64_t scan_[2] = {0, 0};
};

}  // namespace vf
