#include "ring_allreduce.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "failure.h"
#include "pattern_data.h"
#include "rdma_setup.h"
#include "verbs_api.h"

namespace nccl_pattern {
namespace {

// One clear-to-send fifo entry, written by the receiver into the sender's host memory with an
// RDMA write; the sender learns of it only by polling that memory (no completion), as in NCCL.
// 'check' lets the sender tell a complete entry from one still being written.
struct alignas(32) CtsEntry {
  uint64_t addr;
  uint32_t rkey;
  uint32_t size;
  uint64_t seq;
  uint64_t check;
};
static_assert(sizeof(CtsEntry) <= kInlineBytes);
constexpr uint64_t kCtsMagic = 0x4354535f6e63636cull;

uint64_t cts_check(uint64_t addr, uint32_t rkey, uint32_t size, uint64_t seq) {
  return mix64(addr ^ (static_cast<uint64_t>(rkey) << 32 | size) ^ mix64(seq) ^ kCtsMagic);
}

// Each WR's id says what it was, for which message and on which QP of the connection.
enum class WrKind : uint64_t { kData = 1, kDataImm = 2, kRecv = 3, kCts = 4, kFlush = 5 };
uint64_t wr_id(WrKind kind, uint64_t seq, int qp) {
  return static_cast<uint64_t>(kind) << 56 | (seq & 0xffffffffffull) << 8 | static_cast<uint64_t>(qp);
}
WrKind wr_kind(uint64_t id) { return static_cast<WrKind>(id >> 56); }
uint64_t wr_seq(uint64_t id) { return (id >> 8) & 0xffffffffffull; }
int wr_qp(uint64_t id) { return static_cast<int>(id & 0xff); }

// The immediate of the signaled write that ends a message part: sequence and QP index, so the
// receiver can detect a lost, duplicated or reordered message.
uint32_t make_imm(uint64_t seq, int qp) { return static_cast<uint32_t>((seq & 0xffffff) << 8 | static_cast<uint64_t>(qp)); }

constexpr int kMaxWritesPerImm = 8;  // up to 8 unsignaled writes, then the signaled write-with-imm
constexpr uint64_t kMinSliceBytes = 1024;

struct Counters {
  uint64_t writes = 0, write_imms = 0, reads = 0, cts = 0;
};

class RingRank {
 public:
  explicit RingRank(RankPlan& plan);
  void run(Counters& counters);

 private:
  struct Chunk {
    uint64_t offset;  // bytes from the segment start
    uint64_t size;
  };
  enum class Phase { kReduceScatter, kAllGather };

  void bootstrap();
  void run_step(int iter, Phase phase, int step);
  void post_receives_and_cts(uint64_t seq, uint64_t size);
  bool try_send_chunk(uint64_t seq, const uint8_t* src, uint64_t size);
  void handle_completion(const ibv_wc& wc, bool from_send_side);
  void flush_and_check(uint64_t seq);
  void verify_received(int iter, Phase phase, int step, int segment, const Chunk& chunk, const uint64_t* data);
  void expect_quiet_cqs();
  [[noreturn]] void completion_error(const ibv_wc& wc, const std::string& peer);
  Clock::time_point deadline() const { return Clock::now() + std::chrono::seconds(opts_.timeout_s); }
  std::vector<Chunk> chunks_of_segment() const;

  RankPlan& plan_;
  const Options& opts_;
  const VerbsApi& api_;
  const int rank_, n_;
  const uint64_t seg_elems_, seg_bytes_;
  Counters counters_;

  // Declaration order = reverse destruction order: QPs go before the memory, memory before PDs.
  std::shared_ptr<Device> send_dev_, recv_dev_;
  std::vector<uint64_t> accum_;    // the all-reduce buffer (send source, reduction target)
  std::vector<CtsEntry> fifo_;     // clear-to-send slots the next rank writes into
  std::vector<uint8_t> staging_;   // receive slots the previous rank writes into
  uint64_t flush_target_ = 0;
  std::unique_ptr<MemoryRegion> accum_mr_, fifo_mr_, staging_mr_, flush_mr_;
  std::unique_ptr<QpGroup> send_conn_, recv_conn_, flush_qp_;
  uint64_t peer_fifo_addr_ = 0;
  uint32_t peer_fifo_rkey_ = 0;

  // Sequence numbers run on across steps and iterations (1-based: a zeroed fifo slot never matches).
  uint64_t send_seq_ = 1, recv_seq_ = 1;
  // Per-step state.
  uint64_t step_send_base_ = 0, step_recv_base_ = 0;
  std::vector<uint8_t> imm_done_;  // [chunk * nqps + qp]: write-with-imm completion seen
  uint64_t imm_pending_ = 0;
  std::vector<int> arrived_;       // receive completions per chunk
  std::vector<uint64_t> next_on_qp_;  // next chunk expected on each receive QP
  uint64_t cts_pending_ = 0;
  uint64_t chunks_posted_total_ = 0;
  bool injected_ = false;
  bool restored_ = false;
};

RingRank::RingRank(RankPlan& plan)
    : plan_(plan),
      opts_(*plan.options),
      api_(verbs()),
      rank_(plan.rank),
      n_(plan.options->nranks),
      seg_elems_(plan.options->bytes / 8 / static_cast<uint64_t>(plan.options->nranks)),
      seg_bytes_(seg_elems_ * 8) {
  send_dev_ = std::make_shared<Device>(plan.dev, opts_.gid_index, rank_);
  recv_dev_ = plan.prev_dev == plan.dev ? send_dev_ : std::make_shared<Device>(plan.prev_dev, opts_.gid_index, rank_);
  accum_.assign(opts_.bytes / 8, 0);
  fifo_.assign(static_cast<size_t>(opts_.fifo_depth), CtsEntry{});
  staging_.assign(static_cast<size_t>(opts_.fifo_depth) * opts_.chunk_bytes, 0);
  accum_mr_ = std::make_unique<MemoryRegion>(*send_dev_, accum_.data(), opts_.bytes);
  fifo_mr_ = std::make_unique<MemoryRegion>(*send_dev_, fifo_.data(), fifo_.size() * sizeof(CtsEntry));
  staging_mr_ = std::make_unique<MemoryRegion>(*recv_dev_, staging_.data(), staging_.size());
  flush_mr_ = std::make_unique<MemoryRegion>(*recv_dev_, &flush_target_, sizeof(flush_target_));
  send_conn_ = std::make_unique<QpGroup>(*send_dev_, opts_.qps_per_conn);
  recv_conn_ = std::make_unique<QpGroup>(*recv_dev_, opts_.qps_per_conn);
  flush_qp_ = std::make_unique<QpGroup>(*recv_dev_, 1);
}

void RingRank::bootstrap() {
  const auto until = deadline();
  EndpointWire send_side{}, recv_side{}, next_recv_side{}, prev_send_side{};
  send_conn_->describe(send_side);
  send_side.rank = static_cast<uint32_t>(rank_);
  send_side.fifo_addr = reinterpret_cast<uintptr_t>(fifo_.data());
  send_side.fifo_rkey = fifo_mr_->mr->rkey;
  recv_conn_->describe(recv_side);
  recv_side.rank = static_cast<uint32_t>(rank_);
  // Both writes first, then both reads: small messages never block, so no ordering deadlock.
  plan_.to_next.send_all(&send_side, sizeof(send_side), until, "endpoint to the next rank");
  plan_.from_prev.send_all(&recv_side, sizeof(recv_side), until, "endpoint to the previous rank");
  plan_.to_next.recv_all(&next_recv_side, sizeof(next_recv_side), until, "endpoint of the next rank");
  plan_.from_prev.recv_all(&prev_send_side, sizeof(prev_send_side), until, "endpoint of the previous rank");
  send_conn_->connect(next_recv_side, opts_.ib_timeout);
  recv_conn_->connect(prev_send_side, opts_.ib_timeout);
  peer_fifo_addr_ = prev_send_side.fifo_addr;
  peer_fifo_rkey_ = prev_send_side.fifo_rkey;
  // The GPUDirect-flush QP is connected to itself.
  EndpointWire self{};
  flush_qp_->describe(self);
  flush_qp_->connect(self, opts_.ib_timeout);
  // Nobody writes (clear-to-send or data) before both peers' QPs are ready to receive.
  const char ready = 'R';
  char got_next = 0, got_prev = 0;
  plan_.to_next.send_all(&ready, 1, until, "ready to the next rank");
  plan_.from_prev.send_all(&ready, 1, until, "ready to the previous rank");
  plan_.to_next.recv_all(&got_next, 1, until, "ready from the next rank");
  plan_.from_prev.recv_all(&got_prev, 1, until, "ready from the previous rank");
  if (got_next != ready || got_prev != ready) fail("bootstrap: bad ready byte");
}

std::vector<RingRank::Chunk> RingRank::chunks_of_segment() const {
  std::vector<Chunk> chunks;
  for (uint64_t off = 0; off < seg_bytes_; off += opts_.chunk_bytes)
    chunks.push_back({off, std::min(opts_.chunk_bytes, seg_bytes_ - off)});
  return chunks;
}

void RingRank::post_receives_and_cts(uint64_t seq, uint64_t size) {
  // One zero-SGE receive per QP: each QP's part ends with a write-with-imm that consumes it.
  for (int q = 0; q < opts_.qps_per_conn; ++q) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id(WrKind::kRecv, seq, q);
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(recv_conn_->qps[static_cast<size_t>(q)], &wr, &bad); rc != 0)
      fail("ibv_post_recv failed: " + std::string(std::strerror(rc)));
  }
  const uint64_t slot = seq % static_cast<uint64_t>(opts_.fifo_depth);
  CtsEntry entry{};
  entry.addr = reinterpret_cast<uintptr_t>(staging_.data() + slot * opts_.chunk_bytes);
  entry.rkey = staging_mr_->mr->rkey;
  entry.size = static_cast<uint32_t>(size);
  entry.seq = seq;
  entry.check = cts_check(entry.addr, entry.rkey, entry.size, entry.seq);
  ibv_sge sge{reinterpret_cast<uintptr_t>(&entry), sizeof(entry), 0};
  ibv_send_wr wr{};
  wr.wr_id = wr_id(WrKind::kCts, seq, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = peer_fifo_addr_ + slot * sizeof(CtsEntry);
  wr.wr.rdma.rkey = peer_fifo_rkey_;
  const int q = static_cast<int>(seq % static_cast<uint64_t>(opts_.qps_per_conn));
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(recv_conn_->qps[static_cast<size_t>(q)], &wr, &bad); rc != 0)
    fail("ibv_post_send (clear-to-send) failed: " + std::string(std::strerror(rc)));
  ++counters_.cts;
  ++cts_pending_;
}

bool RingRank::try_send_chunk(uint64_t seq, const uint8_t* src, uint64_t size) {
  const uint64_t slot = seq % static_cast<uint64_t>(opts_.fifo_depth);
  volatile CtsEntry* entry = &fifo_[slot];
  if (entry->seq != seq) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint64_t addr = entry->addr;
  const uint32_t rkey = entry->rkey;
  const uint32_t cts_size = entry->size;
  if (entry->check != cts_check(addr, rkey, cts_size, seq)) return false;  // still being written
  if (cts_size != size)
    fail("clear-to-send for message " + std::to_string(seq) + " grants " + std::to_string(cts_size) +
         " bytes, expected " + std::to_string(size));
  // The chunk is spread over the connection's QPs; on each, up to 8 unsignaled RDMA writes and
  // a signaled RDMA write-with-imm.
  const uint64_t elems = size / 8;
  const int nqps = opts_.qps_per_conn;
  for (int q = 0; q < nqps; ++q) {
    const uint64_t part_begin = elems * static_cast<uint64_t>(q) / static_cast<uint64_t>(nqps) * 8;
    const uint64_t part_end = elems * static_cast<uint64_t>(q + 1) / static_cast<uint64_t>(nqps) * 8;
    const uint64_t part = part_end - part_begin;
    const uint64_t slices = std::clamp<uint64_t>(part / kMinSliceBytes, 1, kMaxWritesPerImm + 1);
    ibv_sge sges[kMaxWritesPerImm + 1];
    ibv_send_wr wrs[kMaxWritesPerImm + 1];
    for (uint64_t s = 0; s < slices; ++s) {
      const uint64_t begin = part_begin + part / 8 * s / slices * 8;
      const uint64_t end = s + 1 == slices ? part_end : part_begin + part / 8 * (s + 1) / slices * 8;
      const bool last = s + 1 == slices;
      sges[s] = ibv_sge{reinterpret_cast<uintptr_t>(src + begin), static_cast<uint32_t>(end - begin),
                        accum_mr_->mr->lkey};
      wrs[s] = ibv_send_wr{};
      wrs[s].wr_id = wr_id(last ? WrKind::kDataImm : WrKind::kData, seq, q);
      wrs[s].sg_list = end > begin ? &sges[s] : nullptr;
      wrs[s].num_sge = end > begin ? 1 : 0;
      wrs[s].opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      wrs[s].send_flags = last ? IBV_SEND_SIGNALED : 0;
      wrs[s].imm_data = last ? make_imm(seq, q) : 0;
      wrs[s].wr.rdma.remote_addr = addr + begin;
      wrs[s].wr.rdma.rkey = rkey;
      wrs[s].next = last ? nullptr : &wrs[s + 1];
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(send_conn_->qps[static_cast<size_t>(q)], &wrs[0], &bad); rc != 0)
      fail("ibv_post_send (data) failed: " + std::string(std::strerror(rc)));
    counters_.writes += slices - 1;
    ++counters_.write_imms;
  }
  ++chunks_posted_total_;
  if (plan_.inject_port_down != nullptr && !injected_ &&
      chunks_posted_total_ == static_cast<uint64_t>(opts_.inject_port_down_after)) {
    injected_ = true;
    std::printf("nccl_pattern: rank %d injecting fake_verbs_port_down(%s) after %" PRIu64 " chunks\n", rank_,
                send_dev_->name.c_str(), chunks_posted_total_);
    std::fflush(stdout);
    plan_.inject_port_down(send_dev_->index);
  }
  if (plan_.inject_port_up != nullptr && injected_ && !restored_ &&
      chunks_posted_total_ == static_cast<uint64_t>(opts_.inject_port_up_after)) {
    restored_ = true;
    std::printf("nccl_pattern: rank %d injecting fake_verbs_port_up(%s) after %" PRIu64 " chunks\n",
                rank_, send_dev_->name.c_str(), chunks_posted_total_);
    std::fflush(stdout);
    plan_.inject_port_up(send_dev_->index);
  }
  return true;
}

void RingRank::completion_error(const ibv_wc& wc, const std::string& peer) {
  char text[512];
  std::snprintf(text, sizeof(text),
                "NET/IB-like : Got completion from peer %s with status=%s opcode=%d len=%u vendor_err=%u qpn=%u "
                "wr_id=0x%" PRIx64,
                peer.c_str(), api_.status_name(wc.status).c_str(), static_cast<int>(wc.opcode), wc.byte_len,
                wc.vendor_err, wc.qp_num, wc.wr_id);
  std::fprintf(stderr, "nccl_pattern: rank %d %s\n", rank_, text);
  fail(text);
}

void RingRank::handle_completion(const ibv_wc& wc, bool from_send_side) {
  if (wc.status != IBV_WC_SUCCESS) completion_error(wc, from_send_side ? plan_.next_name : plan_.prev_name);
  const uint64_t seq = wr_seq(wc.wr_id);
  const int q = wr_qp(wc.wr_id);
  const WrKind kind = wr_kind(wc.wr_id);
  const uint64_t chunks = arrived_.size();
  auto unexpected = [&](const char* why) {
    char text[256];
    std::snprintf(text, sizeof(text), "unexpected completion (%s): wr_id=0x%" PRIx64 " opcode=%d qpn=%u imm=0x%x", why,
                  wc.wr_id, static_cast<int>(wc.opcode), wc.qp_num, wc.imm_data);
    fail(text);
  };
  if (from_send_side) {
    if (kind != WrKind::kDataImm || wc.opcode != IBV_WC_RDMA_WRITE) unexpected("not a data write-with-imm");
    if (seq < step_send_base_ || seq >= step_send_base_ + chunks) unexpected("message outside this step");
    if (send_conn_->index_of(wc.qp_num) != q) unexpected("on the wrong QP");
    uint8_t& done = imm_done_[(seq - step_send_base_) * static_cast<uint64_t>(opts_.qps_per_conn) + static_cast<uint64_t>(q)];
    if (done != 0) unexpected("duplicate send completion");
    done = 1;
    --imm_pending_;
    return;
  }
  if (kind == WrKind::kCts) {
    if (wc.opcode != IBV_WC_RDMA_WRITE || cts_pending_ == 0) unexpected("clear-to-send");
    --cts_pending_;
    return;
  }
  if (kind != WrKind::kRecv || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0)
    unexpected("not a receive of a write-with-imm");
  if (recv_conn_->index_of(wc.qp_num) != q) unexpected("receive on the wrong QP");
  const uint64_t chunk = seq - step_recv_base_;
  if (seq < step_recv_base_ || chunk >= chunks || next_on_qp_[static_cast<size_t>(q)] != chunk)
    unexpected("receive out of order");
  const uint64_t expected_seq = step_recv_base_ + chunk;
  if (wc.imm_data != make_imm(expected_seq, q)) unexpected("immediate names another message (lost or duplicated)");
  ++next_on_qp_[static_cast<size_t>(q)];
  ++arrived_[chunk];
}

void RingRank::flush_and_check(uint64_t seq) {
  // Like NCCL's GPUDirect flush: a signaled RDMA read through the self-connected QP of the
  // receiving NIC, after the message's write-with-imm completions.
  const uint64_t slot = seq % static_cast<uint64_t>(opts_.fifo_depth);
  uint8_t* slot_addr = staging_.data() + slot * opts_.chunk_bytes;
  flush_target_ = ~0ull;
  ibv_sge sge{reinterpret_cast<uintptr_t>(&flush_target_), sizeof(flush_target_), flush_mr_->mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id(WrKind::kFlush, seq, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(slot_addr);
  wr.wr.rdma.rkey = staging_mr_->mr->rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(flush_qp_->qps[0], &wr, &bad); rc != 0)
    fail("ibv_post_send (flush read) failed: " + std::string(std::strerror(rc)));
  ++counters_.reads;
  const auto until = deadline();
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(flush_qp_->cq, 1, &wc);
    if (n < 0) fail("ibv_poll_cq (flush) failed");
    if (n == 1) {
      if (wc.status != IBV_WC_SUCCESS) completion_error(wc, "self (flush QP on " + recv_dev_->name + ")");
      if (wc.wr_id != wr.wr_id || wc.opcode != IBV_WC_RDMA_READ)
        fail("flush: unexpected completion wr_id=" + std::to_string(wc.wr_id));
      break;
    }
    throw_if_aborted();
    if (Clock::now() >= until) fail("timeout waiting for the flush read of message " + std::to_string(seq));
  }
  uint64_t head = 0;
  std::memcpy(&head, slot_addr, sizeof(head));
  if (head != flush_target_) fail("flush read returned data that differs from the received message");
}

void RingRank::verify_received(int iter, Phase phase, int step, int segment, const Chunk& chunk,
                               const uint64_t* data) {
  // Reduce-scatter step k delivers the sum over ranks prev, prev-1, ..., prev-k; all-gather
  // delivers the full sum.
  const int prev = (rank_ - 1 + n_) % n_;
  const int count = phase == Phase::kReduceScatter ? step + 1 : n_;
  const uint64_t first = static_cast<uint64_t>(segment) * seg_elems_ + chunk.offset / 8;
  for (uint64_t i = 0; i < chunk.size / 8; ++i) {
    const uint64_t want = partial_sum(opts_.seed, n_, prev, count, iter, first + i);
    if (data[i] != want) {
      char text[256];
      std::snprintf(text, sizeof(text),
                    "data mismatch in %s step %d from rank %d: element %" PRIu64 " is 0x%" PRIx64 ", expected 0x%" PRIx64,
                    phase == Phase::kReduceScatter ? "reduce-scatter" : "all-gather", step, prev, first + i, data[i], want);
      fail(text);
    }
  }
}

void RingRank::run_step(int iter, Phase phase, int step) {
  // Ring schedule: reduce-scatter step k sends segment r-k and receives r-k-1; all-gather step k
  // sends r+1-k and receives r-k.
  const int send_seg = phase == Phase::kReduceScatter ? ((rank_ - step) % n_ + n_) % n_ : ((rank_ + 1 - step) % n_ + n_) % n_;
  const int recv_seg = phase == Phase::kReduceScatter ? ((rank_ - step - 1) % n_ + n_) % n_ : ((rank_ - step) % n_ + n_) % n_;
  const std::vector<Chunk> chunks = chunks_of_segment();
  const uint64_t m = chunks.size();
  const auto nqps = static_cast<uint64_t>(opts_.qps_per_conn);
  const auto depth = static_cast<uint64_t>(opts_.fifo_depth);
  step_send_base_ = send_seq_;
  step_recv_base_ = recv_seq_;
  imm_done_.assign(m * nqps, 0);
  imm_pending_ = m * nqps;
  arrived_.assign(m, 0);
  next_on_qp_.assign(nqps, 0);
  auto* base = reinterpret_cast<uint8_t*>(accum_.data());
  uint64_t sent = 0, cts_posted = 0, consumed = 0;
  const auto until = deadline();
  ibv_wc wcs[16];
  while (sent < m || imm_pending_ > 0 || consumed < m || cts_pending_ > 0) {
    // Receiver: grant free staging slots to the previous rank.
    while (cts_posted < m && cts_posted < consumed + depth) {
      post_receives_and_cts(step_recv_base_ + cts_posted, chunks[cts_posted].size);
      ++cts_posted;
    }
    // Sender: poll the fifo in host memory for the next grant.
    bool progressed = false;
    if (sent < m &&
        try_send_chunk(step_send_base_ + sent, base + static_cast<uint64_t>(send_seg) * seg_bytes_ + chunks[sent].offset,
                       chunks[sent].size)) {
      ++sent;
      progressed = true;
    }
    int n = ibv_poll_cq(send_conn_->cq, 16, wcs);
    if (n < 0) fail("ibv_poll_cq failed on " + send_dev_->name);
    for (int i = 0; i < n; ++i) handle_completion(wcs[i], true);
    progressed |= n > 0;
    n = ibv_poll_cq(recv_conn_->cq, 16, wcs);
    if (n < 0) fail("ibv_poll_cq failed on " + recv_dev_->name);
    for (int i = 0; i < n; ++i) handle_completion(wcs[i], false);
    progressed |= n > 0;
    // Busy polling, like NCCL, but an idle pass yields: in the lab two ranks and Soft-RoCE's
    // kernel work share one emulated CPU, and spinning would starve the very work awaited.
    if (!progressed) sched_yield();
    // Consume complete messages in order: flush, verify every byte, reduce or copy.
    while (consumed < m && arrived_[consumed] == opts_.qps_per_conn) {
      const uint64_t seq = step_recv_base_ + consumed;
      flush_and_check(seq);
      const Chunk& chunk = chunks[consumed];
      const auto* data = reinterpret_cast<const uint64_t*>(staging_.data() + (seq % depth) * opts_.chunk_bytes);
      verify_received(iter, phase, step, recv_seg, chunk, data);
      uint64_t* dst = accum_.data() + static_cast<uint64_t>(recv_seg) * seg_elems_ + chunk.offset / 8;
      for (uint64_t i = 0; i < chunk.size / 8; ++i) dst[i] = phase == Phase::kReduceScatter ? dst[i] + data[i] : data[i];
      ++consumed;
    }
    throw_if_aborted();
    if (Clock::now() >= until) {
      char text[256];
      std::snprintf(text, sizeof(text),
                    "timeout after %d s in iteration %d %s step %d: sent %" PRIu64 "/%" PRIu64
                    " (write-with-imm completions awaited %" PRIu64 "), received %" PRIu64 "/%" PRIu64 ", clear-to-send pending %" PRIu64,
                    opts_.timeout_s, iter, phase == Phase::kReduceScatter ? "reduce-scatter" : "all-gather", step, sent,
                    m, imm_pending_, consumed, m, cts_pending_);
      fail(text);
    }
  }
  send_seq_ += m;
  recv_seq_ += m;
}

void RingRank::expect_quiet_cqs() {
  // After the closing barrier nothing may arrive any more: a late completion is a duplicate.
  ibv_wc wc{};
  for (ibv_cq* cq : {send_conn_->cq, recv_conn_->cq, flush_qp_->cq}) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n != 0)
      fail("unexpected extra completion after the run (duplicate?): wr_id=" + std::to_string(wc.wr_id) +
           " status=" + api_.status_name(wc.status));
  }
}

void RingRank::run(Counters& counters) {
  bootstrap();
  std::printf("nccl_pattern: rank %d connected: next %s via %s, prev %s via %s, %d QPs per connection; traffic started\n",
              rank_, plan_.next_name.c_str(), send_dev_->name.c_str(), plan_.prev_name.c_str(),
              recv_dev_->name.c_str(), opts_.qps_per_conn);
  std::fflush(stdout);
  for (int iter = 0; iter < opts_.iters; ++iter) {
    for (uint64_t i = 0; i < accum_.size(); ++i) accum_[i] = input_value(opts_.seed, rank_, iter, i);
    for (int step = 0; step < n_ - 1; ++step) run_step(iter, Phase::kReduceScatter, step);
    for (int step = 0; step < n_ - 1; ++step) run_step(iter, Phase::kAllGather, step);
    for (uint64_t i = 0; i < accum_.size(); ++i)
      if (accum_[i] != partial_sum(opts_.seed, n_, n_ - 1, n_, iter, i))
        fail("final result mismatch in iteration " + std::to_string(iter) + " at element " + std::to_string(i));
  }
  // Closing barrier: no peer tears down its QPs while the other may still need them.
  const auto until = deadline();
  const char done = 'D';
  char got_next = 0, got_prev = 0;
  plan_.to_next.send_all(&done, 1, until, "done to the next rank");
  plan_.from_prev.send_all(&done, 1, until, "done to the previous rank");
  plan_.to_next.recv_all(&got_next, 1, until, "done from the next rank");
  plan_.from_prev.recv_all(&got_prev, 1, until, "done from the previous rank");
  if (got_next != done || got_prev != done) fail("closing barrier: bad byte");
  expect_quiet_cqs();
  counters = counters_;
}

}  // namespace

bool run_rank(RankPlan& plan) {
  const auto start = Clock::now();
  const Options& o = *plan.options;
  try {
    Counters c;
    {
      RingRank rank(plan);
      rank.run(c);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("nccl_pattern: rank %d PASS iters=%d bytes=%" PRIu64 " writes=%" PRIu64 " write_imms=%" PRIu64
                " reads=%" PRIu64 " cts=%" PRIu64 " seconds=%.2f\n",
                plan.rank, o.iters, o.bytes, c.writes, c.write_imms, c.reads, c.cts, seconds);
    std::fflush(stdout);
    return true;
  } catch (const WorkloadError& e) {
    g_abort_all = true;
    std::printf("nccl_pattern: rank %d FAIL %s\n", plan.rank, e.what());
    std::fflush(stdout);
    return false;
  }
}

}  // namespace nccl_pattern
