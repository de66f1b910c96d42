// The send side of exactly-once failover (docs/design.md §5): every send work request of a
// protected QP stays here, in posting order, until a completion proves it done; after a failover
// the ring says exactly which requests to replay on the standby path.
#pragma once

#include <infiniband/verbs.h>

#include <errno.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace vf {

struct SendRecord {
  std::uint64_t sequence = 0;  // posting order, from 1
  // Receive-consuming messages (SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM) posted up to and
  // including this one: the peer's count of delivered messages is compared with it.
  std::uint64_t message_index = 0;
  ibv_send_wr wr{};  // sg_list and next point nowhere; use sges()/inline_data()
  std::uint32_t num_sge = 0;
  std::uint32_t inline_length = 0;
  bool signaled = false;  // a completion will report it (IBV_SEND_SIGNALED or sq_sig_all)
  // Proven done by the peer, but behind a request being replayed: it goes again as a zero-length
  // RDMA WRITE (no remote effect, no receive consumed), only so that its completion comes in
  // posting order, after the replayed one's (finish_switch).
  bool stand_in = false;
  bool consumes_receive() const { return opcode_consumes_receive(wr.opcode); }
  bool is_atomic() const;
  // What a completion of this request says it was.
  ibv_wc_opcode completion_opcode() const;
  // The peer's key this request names, which a post on another device must translate: an RDMA
  // or atomic request's rkey (in `post`, a copy of wr to be posted). None (nullptr) for a SEND,
  // and for a zero-length RDMA WRITE or READ: the responder checks neither its address nor its
  // rkey (IBA C9-88), and programs leave them unset (rsockets' control messages are
  // zero-length WRITE_WITH_IMMs whose rkey is stack garbage).
  std::uint32_t* remote_key_in(ibv_send_wr& post, std::uint64_t payload_length) const;
  static constexpr bool opcode_consumes_receive(ibv_wr_opcode opcode) {
    return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
           opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_SEND_WITH_INV;
  }
  // What the ring can replay on another device: SEND, SEND_WITH_IMM, RDMA_WRITE(_WITH_IMM),
  // RDMA_READ and the two atomics (enum values 0-6). LOCAL_INV, BIND_MW and SEND_WITH_INV name a
  // memory window or key of one device, which no other device knows; ATOMIC_WRITE, TSO and
  // driver opcodes are not modelled (issue 19 item 8, docs/design.md §5h).
  static constexpr bool opcode_replayable(ibv_wr_opcode opcode) {
    return static_cast<unsigned>(opcode) <= static_cast<unsigned>(IBV_WR_ATOMIC_FETCH_AND_ADD);
  }
};
static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_RDMA_WRITE_WITH_IMM == 1 && IBV_WR_SEND == 2 &&
                  IBV_WR_SEND_WITH_IMM == 3 && IBV_WR_RDMA_READ == 4 &&
                  IBV_WR_ATOMIC_CMP_AND_SWP == 5 && IBV_WR_ATOMIC_FETCH_AND_ADD == 6,
              "opcode_replayable relies on libibverbs' numbering of the replayable opcodes");

class RetransmitRing {
 public:
  static constexpr std::uint32_t kMaxCapacity = 1u << 16;
  static constexpr std::uint32_t kMaxSge = 32;
  // record's answer to a request it cannot replay (SendRecord::opcode_replayable): not an errno.
  static constexpr int kNotReplayable = -1;

  // Allocates everything once, at QP creation (control path): recording never allocates.
  RetransmitRing(std::uint32_t capacity, std::uint32_t max_sge, std::uint32_t max_inline);

  // Copies one work request (its SGEs, and its payload when IBV_SEND_INLINE: the application may
  // reuse the buffer as soon as post_send returns). Returns 0, ENOMEM when the ring is full (the
  // send queue is), EINVAL when the request exceeds the QP's SGE or inline limits, or
  // kNotReplayable (nothing recorded; the caller decides what the QP does with such a request).
  // Inline: it runs inside every ibv_post_send of a protected QP.
  int record(const ibv_send_wr& wr, bool signal_all = false);
  // Undoes the newest `count` records (the provider refused them: they were never posted).
  void drop_newest(std::uint32_t count);
  // A successful completion on a path that carries the application's own wr_id: RC completes in
  // order, so it belongs to the oldest signaled request; it and everything before it retire.
  // Null when no signaled request is outstanding or its wr_id differs (the caller then treats
  // the completion as not the ring's: an application error path, logged); else the retired
  // request, valid until the next record().
  const SendRecord* retire_next_signaled(std::uint64_t wr_id);
  // A successful completion on a path that carries the ring's sequence as wr_id: copies the
  // request out (for the application's wr_id and opcode) and retires it and everything earlier.
  bool retire_sequence(std::uint64_t sequence, SendRecord& out);
  // The outstanding request with this sequence, or nullptr (nothing retires).
  const SendRecord* find_sequence(std::uint64_t sequence) const {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      const SendRecord& entry = records_[slot_of(position)];
      if (entry.sequence == sequence) return &entry;
      if (entry.sequence > sequence) break;
    }
    return nullptr;
  }
  // Keeps only the outstanding requests `keep` accepts, in order (after a failover: what was
  // proven done leaves the ring). Sequences and message indexes are preserved.
  template <typename Keep>
  void compact(Keep&& keep);
  // Visits outstanding requests with sequence >= `from`, oldest first; stops when visit is false.
  template <typename Visit>
  void for_each_from(std::uint64_t from, Visit&& visit) const {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      const SendRecord& entry = records_[slot_of(position)];
      if (entry.sequence >= from && !visit(entry)) return;
    }
  }
  // An atomic among the posted requests (sequence < `posted_before`) not yet retired.
  bool atomic_posted(std::uint64_t posted_before) const {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      const SendRecord& entry = records_[slot_of(position)];
      if (entry.sequence >= posted_before) return false;
      if (entry.is_atomic()) return true;
    }
    return false;
  }
  // Outstanding requests, oldest first, for the engine to mark (SendRecord::stand_in).
  template <typename Visit>
  void for_each_mutable(Visit&& visit) {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      visit(records_[slot_of(position)]);
    }
  }
  // Outstanding requests, oldest first.
  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (std::uint64_t position = head_; position < tail_; ++position) {
      visit(records_[slot_of(position)]);
    }
  }

  // A successful completion of the request with this sequence: RC completes in order, so it and
  // every earlier request (unsignaled ones included) are done.
  void retire_through(std::uint64_t sequence);

  // What to do with the outstanding requests after a failover, given how many receive-consuming
  // messages the peer reports having delivered from this QP:
  //  - replay: every message after that count; every write posted after the last delivered
  //    message (whether it executed cannot be known; it is re-executed in order with the same
  //    data); every RDMA_READ (its response may have been lost even when later messages were
  //    delivered, and reading again is harmless);
  //  - unrecoverable: atomics — one that executed must not run twice, and its result may be lost;
  //    they complete with an error (docs/design.md §5).
  // Both hold pointers into the ring, in posting order. Returns false if the peer claims more
  // messages than were ever posted (a protocol error).
  bool replay_set(std::uint64_t delivered_messages, std::vector<const SendRecord*>& replay,
                  std::vector<const SendRecord*>& unrecoverable) const;

  const ibv_sge* sges(const SendRecord& record) const;
  const std::uint8_t* inline_data(const SendRecord& record) const;
  // Bytes the request carries (its inline copy, or the sum of its SGEs).
  std::uint64_t payload_length(const SendRecord& record) const;

  std::uint32_t outstanding() const { return static_cast<std::uint32_t>(tail_ - head_); }
  std::uint32_t capacity() const { return capacity_; }
  std::uint64_t last_sequence() const { return next_sequence_ - 1; }
  std::uint64_t messages_posted() const { return messages_posted_; }
  std::uint64_t next_sequence() const { return next_sequence_; }

 private:
  std::uint32_t slot_of(std::uint64_t position) const {
    return static_cast<std::uint32_t>(position & mask_);
  }
  void move_slot(std::uint32_t from, std::uint32_t to);
  void push_signaled(std::uint64_t position) { signaled_[sig_tail_++ & mask_] = position; }
  void drop_retired_signaled() {
    while (sig_head_ < sig_tail_ && signaled_[sig_head_ & mask_] < head_) ++sig_head_;
  }

  std::uint32_t capacity_;  // how many requests may be outstanding (the send queue's depth)
  std::uint32_t slots_;     // capacity_ rounded up to a power of two: a slot is a mask away
  std::uint32_t mask_;
  std::uint32_t max_sge_;
  std::uint32_t max_inline_;
  std::vector<SendRecord> records_;
  std::vector<ibv_sge> sge_storage_;           // capacity * max_sge
  std::vector<std::uint8_t> inline_storage_;   // capacity * max_inline
  // Positions of the outstanding signaled requests, oldest first: a completion retires through
  // the oldest one without walking the unsignaled requests before it.
  std::vector<std::uint64_t> signaled_;
  std::uint64_t sig_head_ = 0;
  std::uint64_t sig_tail_ = 0;
  std::uint64_t head_ = 0;  // oldest outstanding position
  std::uint64_t tail_ = 0;  // next free position
  std::uint64_t next_sequence_ = 1;
  std::uint64_t messages_posted_ = 0;
};

[[gnu::always_inline]] inline int RetransmitRing::record(const ibv_send_wr& wr, bool signal_all) {
  const int num_sge = wr.num_sge;
  if (__builtin_expect(!SendRecord::opcode_replayable(wr.opcode), 0)) return kNotReplayable;
  if (__builtin_expect(outstanding() >= capacity_, 0)) return ENOMEM;
  if (__builtin_expect(num_sge < 0 || static_cast<std::uint32_t>(num_sge) > max_sge_, 0)) {
    return EINVAL;
  }
  // The slot past the tail is free: its SGEs and inline bytes are written before the request is
  // validated, and only count once the tail moves.
  const std::uint32_t slot = slot_of(tail_);
  ibv_sge* sge = &sge_storage_[static_cast<std::size_t>(slot) * max_sge_];
  std::uint64_t total_length = 0;
  for (int i = 0; i < num_sge; ++i) {
    sge[i] = wr.sg_list[i];
    total_length += wr.sg_list[i].length;
  }
  std::uint32_t inline_length = 0;
  if (wr.send_flags & IBV_SEND_INLINE) {
    if (__builtin_expect(total_length > max_inline_, 0)) return EINVAL;
    std::uint8_t* data = &inline_storage_[static_cast<std::size_t>(slot) * max_inline_];
    for (int i = 0; i < num_sge; ++i) {
      std::memcpy(data + inline_length,
                  reinterpret_cast<const void*>(static_cast<std::uintptr_t>(sge[i].addr)),
                  sge[i].length);
      inline_length += sge[i].length;
    }
  }
  SendRecord& entry = records_[slot];
  entry.sequence = next_sequence_;
  entry.wr = wr;
  entry.wr.next = nullptr;
  entry.wr.sg_list = nullptr;
  entry.num_sge = static_cast<std::uint32_t>(num_sge);
  entry.inline_length = inline_length;
  const bool signaled = signal_all || (wr.send_flags & IBV_SEND_SIGNALED) != 0;
  entry.signaled = signaled;
  entry.stand_in = false;
  messages_posted_ += SendRecord::opcode_consumes_receive(wr.opcode) ? 1 : 0;
  entry.message_index = messages_posted_;
  if (signaled) push_signaled(tail_);
  ++next_sequence_;
  ++tail_;
  return 0;
}

template <typename Keep>
void RetransmitRing::compact(Keep&& keep) {
  std::uint64_t write = head_;
  sig_head_ = sig_tail_ = 0;
  for (std::uint64_t read = head_; read < tail_; ++read) {
    if (!keep(static_cast<const SendRecord&>(records_[slot_of(read)]))) continue;
    if (write != read) move_slot(slot_of(read), slot_of(write));
    if (records_[slot_of(write)].signaled) push_signaled(write);
    ++write;
  }
  tail_ = write;
}

}  // namespace vf
