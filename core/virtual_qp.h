// The virtual objects of failover (docs/design.md §5): a VirtualQp is the application's RC QP
// seen as a pair of physical paths, a CqState is the application's CQ with its shadow on the
// backup device. This header holds their state and the data-path operations (post, poll), which
// run on the application's threads; the engine (core/failover/) drives pairing and switching
// from its own thread through the same locks.
//
// Locking: each VirtualQp and each CqState has its own SpinLock (never one shared by QPs). Order:
// a CqState lock may be held while taking a VirtualQp lock, never the reverse.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/control_message.h"
#include "core/receive_ring.h"
#include "core/retransmit_ring.h"
#include "core/shadow_events.h"
#include "core/spin_lock.h"

namespace vf {

class VirtualQp;
class VirtualSrq;

inline constexpr int kPathCount = 2;
// Standby receives carry their ring position with this bit set, standby sends their ring
// sequence without it: an error completion (whose opcode is undefined) still says which it is.
inline constexpr std::uint64_t kStandbyReceiveTag = 1ull << 63;
// The wr_id of the drain marker: a zero-SGE receive the engine posts on a path's QP after moving
// it to ERR. A receive queue completes in order, so its flush says every receive posted before
// it has reported (docs/design.md §5d). ("VFDRAIN" in ASCII; an application wr_id is hardly it.)
inline constexpr std::uint64_t kDrainMarkerWrId = 0x0056464452414953ull;
// The wr_id of a probe the engine posts on an idle standby (core/failover/path_probe.h): this
// bit, clear in the standby's ring sequences and receive tags, and the probe's number.
inline constexpr std::uint64_t kProbeTag = 1ull << 62;
inline constexpr bool is_probe_wr_id(std::uint64_t wr_id) { return (wr_id >> 62) == 1; }
inline constexpr int kPrimary = static_cast<int>(PathId::kPrimary);
inline constexpr int kStandby = static_cast<int>(PathId::kStandby);
inline constexpr int other_path(int path) { return 1 - path; }

// Completions held for the application ahead of its CQ: drained by the engine during a switch,
// or synthesized for work the peer proved done. Allocated with the CQ (twice its depth); only
// the engine pushes, and it grows the stash rather than lose a completion (CqState).
class CompletionStash {
 public:
  explicit CompletionStash(std::uint32_t capacity) : slots_(capacity) {}
  // Never refuses: a full stash doubles (a completion left behind would be lost for good).
  void push(const ibv_wc& wc) {
    if (count_ == slots_.size()) grow(2 * slots_.size() + 16);
    slots_[(head_ + count_) % slots_.size()] = wc;
    ++count_;
  }
  int pop(int max, ibv_wc* out) {
    int taken = 0;
    while (taken < max && count_ > 0) {
      out[taken++] = slots_[head_];
      head_ = (head_ + 1) % slots_.size();
      --count_;
    }
    return taken;
  }
  std::size_t size() const { return count_; }
  std::size_t room() const { return slots_.size() - count_; }
  // Engine (the CQ was resized): more room, the held completions kept in order.
  void grow(std::size_t capacity) {
    if (capacity <= slots_.size()) return;
    std::vector<ibv_wc> bigger(capacity);
    for (std::size_t i = 0; i < count_; ++i) bigger[i] = slots_[(head_ + i) % slots_.size()];
    slots_.swap(bigger);
    head_ = 0;
  }

 private:
  std::vector<ibv_wc> slots_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

struct CqState {
  CqState(ibv_cq* cq, int device, const ibv_context_ops* ops, std::uint32_t stash_capacity)
      : app_cq(cq), device_index(device), provider(ops), stash(stash_capacity) {}

  ibv_cq* const app_cq;
  const int device_index;
  const ibv_context_ops* const provider;  // the provider's poll_cq/req_notify_cq of app_cq
  ibv_comp_channel* app_channel = nullptr;

  // The shadow on the backup device (created with the first protected QP that uses this CQ).
  ibv_cq* shadow = nullptr;
  int shadow_device_index = -1;
  ibv_comp_channel* shadow_channel = nullptr;
  // Engine: completions the shim itself may add to the shadow beyond the application's (a drain
  // marker per QP whose receives land here): the shadow holds app_cq->cqe + this many.
  std::uint32_t shim_entries = 0;
  // Engine: the shadow overran (IBV_EVENT_CQ_ERR); a CQ in error is lost for good, so no QP of
  // this CQ uses its standby again.
  bool shadow_failed = false;

  SpinLock lock;
  CompletionStash stash;                    // under lock
  std::atomic<bool> stash_nonempty{false};  // hint read before taking the lock
  std::atomic<bool> shadow_active{false};   // some QP's traffic runs on the shadow
  std::atomic<bool> notify_armed{false};    // the application armed it since the last stash event
  std::atomic<bool> notify_solicited_only{false};  // how it last armed it
  // Completion events of the shadow (or the stash) due to the application's channel, and those
  // handed out and not yet acknowledged by it (ibv_ack_cq_events is split accordingly).
  ShadowEvents shadow_events;
  int wake_fd = -1;  // eventfd of the application's channel record (engine-owned)

  // Under lock (engine): a completion the engine made (synthesized, released, flushed) goes ahead
  // of the CQ. The stash grows when full: never lost. Always true.
  bool stash_for_application(const ibv_wc& wc);

  // The application's ibv_poll_cq (inline, below: every poll of a protected CQ runs it).
  int poll(int num_entries, ibv_wc* wc);
  // Its path when the stash is not empty or the shadow is in use; releases the lock.
  [[gnu::cold]] int poll_merged_locked(int num_entries, ibv_wc* wc);
  // Under lock: the bookkeeping of `polled` completions just taken from `path`'s CQ; compacts
  // wc to those the application must see and returns their number.
  int keep_for_application_locked(int path, int polled, ibv_wc* wc);
  // Engine: polls everything the provider holds on `path`'s CQ into the stash, processing each
  // completion as the application's poll would; the stash grows as needed, so nothing is left.
  static constexpr int kDrainBatch = 16;
  void drain_into_stash(int path);
  void drain_into_stash_locked(int path);  // the same, under lock
  // Engine, while no QP of the CQ runs on the shadow (shadow_active false: no application thread
  // polls the shadow then, and only the engine sets the flag): polls the shadow without the CQ's
  // lock, so that the probes of idle standbys (core/failover/path_probe.h) never revoke the
  // lock's bias (core/spin_lock.h). A probe's completion goes to its QP (record_probe_answer);
  // anything else through the application's bookkeeping, under the locks, into the stash.
  // Returns whether the stash got any.
  bool poll_idle_shadow();

  // Under lock: polls `path`'s physical CQ, keeps what the application must see (returned);
  // *raw says how many the provider gave (hidden ones included).
  int poll_physical(int path, int num_entries, ibv_wc* wc, int* raw = nullptr);
};

// Staging for the ibv_wr_* API: the requests of one wr_start..wr_complete batch.
struct WrBatch {
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;           // kMaxSge per request
  std::vector<std::uint8_t> inline_data;  // max_inline per request
  std::uint32_t count = 0;
  bool direct = false;  // the provider's wr_* functions are being called alongside
  bool overflow = false;  // more requests or SGEs than the QP was created for
  // Direct mode: requests recorded by wr_begin_complete, and the opcode of one the ring cannot
  // replay after them (the QP becomes pass-through if the provider posts the batch), else -1.
  std::uint32_t recorded = 0;
  int unreplayable_opcode = -1;
};

// What the data path needs from the engine, set once by it.
struct DatapathServices {
  // The standby device's lkey of a registration, from the primary lkey.
  bool (*translate_lkey)(int device_index, std::uint32_t lkey, std::uint32_t* out) = nullptr;
  // The peer's standby rkey of a registration, from the rkey the application got.
  bool (*translate_rkey)(std::uint64_t peer, std::uint32_t rkey, std::uint32_t* out) = nullptr;
  // Something for the engine's thread to act on (a link error, a missing translation).
  void (*wake_engine)() = nullptr;
};
void set_datapath_services(const DatapathServices& services);
const DatapathServices& datapath_services();

struct PathCounters {
  std::atomic<std::uint64_t> hidden_error_completions{0};
  std::atomic<std::uint64_t> hidden_async_events{0};
  std::atomic<std::uint64_t> replayed_wrs{0};
  std::atomic<std::uint64_t> synthesized_completions{0};
  std::atomic<std::uint64_t> resumed_unix_ns{0};  // first completion after the latest switch
};

enum class PostMode : std::uint8_t {
  kDirect,   // healthy primary: record, then the provider's post with the application's WR
  kRouted,   // a switch is under way or the standby carries traffic: record, post from the ring
  kBypass,   // not protected for good: straight to the provider, nothing recorded
};

struct PhysicalPath {
  ibv_qp* qp = nullptr;  // primary: the application's own QP; standby: the engine's
  int device_index = -1;
  std::uint8_t port = 1;
  int gid_index = 0;
  Gid gid{};
  int gid_type = -1;      // IBV_GID_TYPE_* of the GID at gid_index; -1 unknown
  std::uint32_t psn = 0;  // this QP's send PSN
  // Towards the peer's QP on the same path: in RTS, or (the standby only) in RTR until the
  // application's own RTS (Protection::standby_rts_pending). Both flags are written by the engine
  // without the QP's lock and read by the data path's error handling (on_error_completion):
  // atomics, so that read is a defined, merely possibly stale, value (the engine releases what
  // a stale "alternative" made the data path hold).
  std::atomic<bool> connected{false};
  std::atomic<bool> failed{false};  // its port went down or it returned a link-class error
};

class VirtualQp {
 public:
  VirtualQp(ibv_qp* app_qp, const ibv_context_ops* provider, const ibv_qp_cap& cap, bool sig_all,
            CqState* send_cq, CqState* recv_cq);

  // ---- data path (application threads) ----
  // Inline (below): the healthy primary's path runs in every post of a protected QP.
  int post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  // One completion polled from `path`'s physical CQ, under lock(): bookkeeping, translation to
  // what the application must see. Returns false when it must not reach the application.
  bool on_completion_locked(CqState& cq, int path, ibv_wc& wc);
  // Engine, when a switch turns out impossible: the error completions hidden in the hope of one
  // go to the application after all, as they would have without the shim.
  struct HeldError {
    CqState* cq;
    ibv_wc wc;      // as the application will see it
    int path;       // where it came from, and its wr_id there (an SRQ receive's record)
    std::uint64_t raw_wr_id;
  };
  void take_held_errors(std::vector<HeldError>& out) {
    out.swap(held_errors_);
    held_errors_.clear();
    held_errors_.reserve(out.capacity());
  }
  void drop_held_errors() { held_errors_.clear(); }
  bool has_held_errors() const { return !held_errors_.empty(); }
  // Whether a held error is more than a flush: the error that killed a path (its QP's first).
  bool holds_a_failure() const {
    for (const HeldError& held : held_errors_)
      if (held.wc.status != IBV_WC_WR_FLUSH_ERR) return true;
    return false;
  }
  // Under lock(): held errors going to the application after all (no switch could happen):
  // those of SRQ receives retire their records, so that no later move posts their buffers again.
  void retire_released_srq_receives(const std::vector<HeldError>& released);
  // ibv_wr_* batch (perftest's default API): the shim's wr_* hooks call these.
  // A batch is staged without the QP's lock (the ibv_wr_* API of one QP is used by one thread at
  // a time; holding the lock across it would deadlock an application that posts a receive or
  // polls inside a batch). In direct mode the hooks also call the provider's functions; the
  // lock is taken in wr_complete, where the mode is checked again: if a switch began meanwhile,
  // the provider's batch is aborted and the staged one is routed instead.
  void wr_start();
  ibv_send_wr* wr_stage(ibv_wr_opcode opcode, std::uint64_t wr_id, unsigned int flags);
  void wr_stage_sges(std::size_t count, const ibv_sge* sges);
  void wr_stage_inline(std::size_t count, const ibv_data_buf* bufs);
  bool wr_direct() const { return batch_.direct; }
  // Direct mode: wr_begin_complete takes the lock and records the batch; 0: still direct, call
  // the provider's wr_complete, then wr_finish with its result (a failure drops the records);
  // kWrRerouted: a switch began, abort the provider's batch and call wr_complete_routed_locked;
  // an errno: refused (lock released). Routed mode: wr_complete_routed does everything.
  static constexpr int kWrRerouted = -1;
  int wr_begin_complete();
  void wr_finish(int provider_result);
  int wr_complete_routed();
  int wr_complete_routed_locked();
  void wr_abort();

  // ---- engine (its thread), under lock() ----
  SpinLock& lock() { return lock_; }
  // A switch takes the QP (routed, holding) unless the application made it pass-through (its
  // data path decides that under the same lock): false then, and nothing changed.
  bool claim_for_switch() {
    lock_.lock();
    const bool claimed = mode_.load(std::memory_order_relaxed) != PostMode::kBypass;
    if (claimed) {
      mode_.store(PostMode::kRouted, std::memory_order_relaxed);
      holding_ = true;
    }
    lock_.unlock();
    return claimed;
  }
  PostMode mode() const { return mode_.load(std::memory_order_relaxed); }
  void set_mode(PostMode mode) { mode_.store(mode, std::memory_order_relaxed); }
  int active_path() const { return active_.load(std::memory_order_relaxed); }
  void set_active_path(int path) { active_.store(path, std::memory_order_relaxed); }
  bool accepting(int path) const { return accepting_[path]; }
  void set_accepting(int path, bool on) { accepting_[path] = on; }
  // The drain marker's flush was polled on this path (on_completion_locked sets it).
  bool drain_marker_seen(int path) const { return drain_marker_seen_[path]; }
  void clear_drain_marker(int path) { drain_marker_seen_[path] = false; }
  // The latest probe completion polled on the standby (by the application's poll of an active
  // shadow, or by the engine: CqState::poll_idle_shadow): its wr_id and status, which the engine
  // reads without the QP's lock (path_probe.cc compares the wr_id with the probe it waits for).
  // Atomics, not the lock: an engine that took the lock once a second would spend the lock's
  // bias budget (core/spin_lock.h) and leave the application's fast path slower for good.
  void record_probe_answer(const ibv_wc& wc) {
    probe_answer_status_.store(wc.status, std::memory_order_relaxed);
    probe_answer_wr_id_.store(wc.wr_id, std::memory_order_release);
  }
  std::uint64_t probe_answer_wr_id() const {
    return probe_answer_wr_id_.load(std::memory_order_acquire);
  }
  ibv_wc_status probe_answer_status() const {
    return probe_answer_status_.load(std::memory_order_relaxed);
  }
  RetransmitRing& send_ring() { return send_ring_; }
  const RetransmitRing& send_ring() const { return send_ring_; }
  ReceiveRing& recv_ring() { return recv_ring_; }
  // Posts what the rings hold beyond what the active path already has. Returns false when a
  // remote key has no translation yet (the engine fetches it and calls again).
  bool post_pending(bool sends = true);
  // Posts the pending receives (all of them, on a fresh path).
  void restart_receives() { next_recv_to_post_ = recv_ring_.oldest_position(); }
  void restart_sends(std::uint64_t from_sequence) { next_send_to_post_ = from_sequence; }

  bool holding() const { return holding_; }
  // While holding, posts are recorded and not sent (a switch is under way).
  void set_holding(bool on) {
    holding_ = on;
    receives_open_ = false;
  }
  // While holding: the new path accepts (begin_switch is done), so receives go there at once.
  // Requests wait for the peer's count (the replay depends on it); a receive need not, and one
  // held back could meet the peer's SEND with an RNR the application's few retries do not cover.
  void open_receives() { receives_open_ = true; }
  std::uint64_t next_send_to_post() const { return next_send_to_post_; }

  ibv_qp* const app_qp;
  const std::uint32_t vqpn;
  const ibv_context_ops* const provider;
  const bool sig_all;
  CqState* const send_cq;
  CqState* const recv_cq;
  // Engine: a shadow of one of its CQs overran (CqState::shadow_failed), so its standby is lost
  // for good.
  bool standby_lost() const { return send_cq->shadow_failed || recv_cq->shadow_failed; }
  // The shared receive queue the QP takes its receives from (its group switches together), or
  // nullptr. Set by the engine before the QP is published.
  VirtualSrq* srq = nullptr;
  PhysicalPath path[kPathCount];
  std::uint64_t peer = 0;  // the engine's id of the peer's translation table
  PathCounters counters;
  // A link-class error completion seen on the active path; the engine acts on it.
  std::atomic<bool> link_error_seen{false};
  // Engine: the pair may get a path back within its grace (Engine::grace_ns: paired, not ended),
  // so a link-class error of the last usable path is held, not shown, as when the other path
  // works; the engine waits for a path (path_wait.h) or shows what it held.
  std::atomic<bool> errors_wait_for_path{false};
  // The application made the QP fail (its own error, or it moved the QP to ERR/RESET).
  std::atomic<bool> application_failed{false};
  // A link-class error reached the application because no path was left (the engine reports
  // the QP unprotected for good, once).
  std::atomic<bool> failure_shown{false};
  // The application posted a request the ring cannot replay (its opcode, else -1): the QP runs
  // pass-through for good on its own QP; the engine ends the pair (periodic_work).
  std::atomic<int> pass_through_opcode{-1};
  std::atomic<bool> awaiting_resume{false};
  std::atomic<bool> translation_missing{false};
  // post_pending left something unposted (a key, a refusal): the engine retries on its passes.
  std::atomic<bool> post_retry_due{false};
  std::uint32_t max_inline;
  std::uint32_t max_send_sge;

 private:
  int post_recv_routed(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  int post_send_routed(ibv_send_wr* wr, ibv_send_wr** bad_wr);
  // The fast paths' rare branches (virtual_qp_datapath.cc). The *_locked ones that return an
  // int release the lock.
  [[gnu::cold]] int post_send_not_direct_locked(ibv_send_wr* wr, ibv_send_wr** bad_wr);
  // `refused` (after `recorded` requests of the chain `wr`) was not recorded: the ones before it
  // are posted (ibv_post_send's contract), or the QP becomes pass-through (kNotReplayable).
  [[gnu::cold]] int refuse_send_locked(ibv_send_wr* wr, ibv_send_wr* refused,
                                       std::uint32_t recorded, int error, ibv_send_wr** bad_wr);
  // A request the ring cannot replay reached the healthy primary: pass-through from now on.
  [[gnu::cold]] void become_pass_through_locked(ibv_wr_opcode opcode);
  [[gnu::cold]] bool may_pass_through_locked() const;
  // Routed: such a request was refused (EOPNOTSUPP); said once per QP, outside the lock.
  [[gnu::cold]] void log_refused_opcode(ibv_wr_opcode opcode);
  [[gnu::cold]] void drop_unposted_sends_locked(ibv_send_wr* wr, const ibv_send_wr* bad,
                                                std::uint32_t recorded);
  [[gnu::cold]] int post_recv_not_direct_locked(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  [[gnu::cold]] int refuse_recv_locked(ibv_recv_wr* wr, ibv_recv_wr* refused,
                                       std::uint32_t recorded, int error, ibv_recv_wr** bad_wr);
  [[gnu::cold]] void drop_unposted_recvs_locked(ibv_recv_wr* wr, const ibv_recv_wr* bad,
                                                std::uint32_t recorded);
  bool post_one_send(const SendRecord& record, int path, bool* missing_key);
  [[gnu::cold]] bool post_stand_in(const SendRecord& record, int path);
  bool post_one_recv(std::uint64_t position, const ReceiveRecord& record, const ibv_sge* sges,
                     int path);
  bool on_error_completion(CqState& cq, int path, ibv_wc& wc);
  // `retire`: the QP is failed for good, so the record of the request or receive is retired
  // (nothing of it will be replayed or re-posted); else it stays, for the other path.
  void translate_standby_error(ibv_wc& wc, bool retire);
  // An error completion shown to the application, of a receive this QP took from its SRQ:
  // retires the receive's record (it left the SRQ for good). True when it translated `wc` (a
  // standby receive, now the application's).
  bool retire_srq_receive_error(const CqState& cq, int path, ibv_wc& wc);
  bool primary_error_is_receive(const CqState& cq, std::uint64_t wr_id) const;

  SpinLock lock_;
  std::atomic<PostMode> mode_{PostMode::kDirect};  // written under lock_; read by wr_start without it
  std::atomic<int> active_{kPrimary};
  bool accepting_[kPathCount] = {true, false};
  bool drain_marker_seen_[kPathCount] = {false, false};
  std::atomic<std::uint64_t> probe_answer_wr_id_{0};
  std::atomic<ibv_wc_status> probe_answer_status_{IBV_WC_SUCCESS};
  RetransmitRing send_ring_;
  ReceiveRing recv_ring_;
  std::uint64_t next_send_to_post_ = 1;  // ring sequence
  std::uint64_t next_recv_to_post_ = 0;  // ring position
  bool holding_ = false;
  bool receives_open_ = false;  // see open_receives
  std::atomic<bool> refused_logged_{false};
  WrBatch batch_;
  std::vector<HeldError> held_errors_;  // capacity fixed at creation: no allocation on the path
};

inline int CqState::poll(int num_entries, ibv_wc* wc) {
  lock.lock();
  if (__builtin_expect(stash_nonempty.load(std::memory_order_relaxed) ||
                           shadow_active.load(std::memory_order_relaxed) || num_entries <= 0,
                       0)) {
    return poll_merged_locked(num_entries, wc);
  }
  int polled = provider->poll_cq(app_cq, num_entries, wc);
  if (polled > 0) {
    const int kept = keep_for_application_locked(kPrimary, polled, wc);
    // A full batch of the shim's own completions says nothing of what follows it.
    if (__builtin_expect(kept == 0 && polled == num_entries, 0)) {
      return poll_merged_locked(num_entries, wc);
    }
    polled = kept;
  }
  lock.unlock();
  return polled;
}

// Healthy primary: record in the ring, then the provider's own call with the application's
// request (no copy of the request is posted, no allocation, no syscall).
inline int VirtualQp::post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  lock_.lock();
  if (__builtin_expect(mode_.load(std::memory_order_relaxed) != PostMode::kDirect, 0)) {
    return post_send_not_direct_locked(wr, bad_wr);
  }
  std::uint32_t recorded = 0;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    const int error = send_ring_.record(*w, sig_all);
    if (__builtin_expect(error != 0, 0)) return refuse_send_locked(wr, w, recorded, error, bad_wr);
    ++recorded;
  }
  const int result = provider->post_send(app_qp, wr, bad_wr);
  if (__builtin_expect(result != 0, 0)) drop_unposted_sends_locked(wr, *bad_wr, recorded);
  next_send_to_post_ = send_ring_.next_sequence();
  lock_.unlock();
  return result;
}

inline int VirtualQp::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  // On an SRQ the provider refuses it, as without the shim.
  if (__builtin_expect(srq != nullptr, 0)) return provider->post_recv(app_qp, wr, bad_wr);
  lock_.lock();
  if (__builtin_expect(mode_.load(std::memory_order_relaxed) != PostMode::kDirect, 0)) {
    return post_recv_not_direct_locked(wr, bad_wr);
  }
  std::uint32_t recorded = 0;
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    const int error = recv_ring_.record(*w);
    if (__builtin_expect(error != 0, 0)) return refuse_recv_locked(wr, w, recorded, error, bad_wr);
    ++recorded;
  }
  const int result = provider->post_recv(app_qp, wr, bad_wr);
  if (__builtin_expect(result != 0, 0)) drop_unposted_recvs_locked(wr, *bad_wr, recorded);
  next_recv_to_post_ = recv_ring_.next_position();
  lock_.unlock();
  return result;
}

// A recorded request's SGEs as `path` needs them: on the standby, each lkey becomes the backup
// device's (primary_device: where the application registered them). False: *missing has none.
bool sges_for_path(int path, int primary_device, const ibv_sge* recorded, std::uint32_t count,
                   ibv_sge* out, std::uint32_t* missing);

// A wc status that says the link (not the application) failed.
bool is_link_failure(ibv_wc_status status);

}  // namespace vf
