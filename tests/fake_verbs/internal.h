// FAKE libibverbs (verbs-failover test double) — private object model.
//
// Every verbs object handed to the application is the rdma-core struct (ibv_qp_ex, ibv_cq, ...)
// placed as the FIRST member of a standard-layout "shell" that also carries a pointer to the fake's
// C++ state. That keeps the public pointer layout-compatible with what a real provider returns
// (so the static inline helpers of <infiniband/verbs.h> work on it) while letting the fake recover
// its own state with a cast instead of a lookup table.
//
// Concurrency: one global fabric mutex (fabric_lock()) guards all of this state. Every exported
// entry point takes it; internal helpers named *_locked expect it held. The fake never calls back
// into user code, so a plain mutex suffices. Blocking calls (ibv_get_cq_event,
// ibv_get_async_event) block on their fd WITHOUT holding the lock.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fake_verbs {

struct Device;
struct Context;
struct Pd;
struct Mr;
struct Cq;
struct CompChannel;
struct Qp;
struct Srq;

// ---- shells: rdma-core object first, fake state pointer second -------------------------------

struct DeviceShell {
  ibv_device dev;
  Device* impl;
};
struct ContextShell {
  verbs_context vctx;  // first, like mlx5_context/rxe_context embed it
  Context* impl;
};
struct PdShell {
  ibv_pd pd;
  Pd* impl;
};
struct MrShell {
  ibv_mr mr;
  Mr* impl;
};
struct CqShell {
  ibv_cq_ex cqx;  // every CQ has the extended layout; ibv_cq is its prefix (ibv_cq_ex_to_cq)
  Cq* impl;
};
struct ChannelShell {
  ibv_comp_channel channel;
  CompChannel* impl;
};
struct QpShell {
  ibv_qp_ex qpx;  // ibv_qp is qpx.qp_base, the first member, so ibv_qp* and ibv_qp_ex* alias
  Qp* impl;
};
struct SrqShell {
  ibv_srq srq;
  Srq* impl;
};
struct AhShell {
  ibv_ah ah;
  ibv_ah_attr attr;
};

// ---- devices --------------------------------------------------------------------------------

constexpr int kGidTableLen = 4;  // 0: link-local, 1: IPv4-mapped, 2-3 free (fake_verbs_move_gid)
// ECE: the fake's vendor id and its two made-up option bits (every fake device supports both; a
// new QP starts with both, as a real NIC's QP starts with its firmware's defaults).
constexpr uint32_t kEceVendorId = 0xfa4e;
constexpr uint32_t kEceSupportedOptions = 0x3;

struct DeviceStats {
  uint64_t tx_messages = 0;
  uint64_t rx_messages = 0;
  uint64_t dropped_packets = 0;
  uint64_t acks_lost = 0;  // acknowledgements lost by fake_verbs_set_lose_acks
};

struct Device {
  DeviceShell shell{};
  int index = 0;  // fakeN
  int host = 0;   // index / 2: which simulated host this NIC belongs to
  int rail = 0;   // index % 2: which rail (NIC) of that host
  uint64_t guid_host_order = 0;
  ibv_gid gids[kGidTableLen]{};
  bool port_up = true;
  bool drop = false;         // silent drop of everything to/from this device
  unsigned delay_steps = 0;  // deliveries to/from this device wait this many progress steps
  // Receive completions of this device's QPs reach their CQ this many steps after the message
  // was placed and acknowledged (fake_verbs_set_recv_completion_delay).
  unsigned recv_cqe_delay_steps = 0;
  // A receive posted to a QP already in ERR waits in the queue until the QP is moved to ERR
  // again, like rxe (fake_verbs_set_flush_on_modify_only).
  bool flush_on_modify_only = false;
  // A requester whose QP has retry_cnt 7 retries a lost packet without end, like rxe
  // (fake_verbs_set_retry_without_end_at_7).
  bool retry_without_end_at_7 = false;
  // The acknowledgements of this many requests from this device's QPs are lost after the
  // responder executed them (fake_verbs_set_lose_acks).
  unsigned lose_acks = 0;
  DeviceStats stats;
  std::vector<Context*> contexts;  // open contexts, to raise async events on
};

// ---- contexts and events --------------------------------------------------------------------

struct Context {
  ContextShell shell{};
  Device* device = nullptr;
  std::deque<ibv_async_event> async_events;  // queued, one eventfd count each
  uint64_t async_events_unacked = 0;
  int live_objects = 0;  // PDs, CQs, channels, QPs: close_device leaks the context while > 0
};

struct Pd {
  PdShell shell{};
  Context* ctx = nullptr;
  int refs = 0;  // MRs, QPs, SRQs, AHs using it: dealloc fails with EBUSY while nonzero
};

struct Mr {
  MrShell shell{};
  Pd* pd = nullptr;
  uint8_t* host_addr = nullptr;  // where the bytes are in this process
  uint64_t iova = 0;             // what remote_addr values refer to
  size_t length = 0;
  int access = 0;
};

// The kernel's side of a completion channel: its event file is `fd`, the number
// ibv_create_comp_channel returned. The kernel knows a channel by that file alone (create_cq,
// get_cq_event read whatever channel->fd holds when called), never by the ibv_comp_channel
// struct, which is the program's (and may be a copy).
struct CompChannel {
  ChannelShell shell{};
  Context* ctx = nullptr;
  int fd = -1;
  std::deque<Cq*> events;  // CQs that fired, in order; one eventfd count each
  int cq_refs = 0;         // CQs attached, whatever struct they were created with
};

struct Cq {
  CqShell shell{};
  ibv_cq* ibcq() { return reinterpret_cast<ibv_cq*>(&shell.cqx); }
  Context* ctx = nullptr;
  CompChannel* channel = nullptr;
  bool extended = false;  // made by ibv_create_cq_ex: start_poll/next_poll/read_* are filled
  uint64_t wc_flags = 0;  // IBV_WC_EX_WITH_* requested at creation
  ibv_wc current{};       // the entry start_poll/next_poll made current (polling thread's)
  int capacity = 0;
  std::deque<ibv_wc> entries;
  bool armed = false;
  bool armed_solicited_only = false;
  bool overflowed = false;
  unsigned events_delivered = 0;  // for ibv_ack_cq_events bookkeeping
  unsigned events_acked = 0;
  int qp_refs = 0;
};

struct RecvWork {
  uint64_t wr_id = 0;
  std::vector<ibv_sge> sges;
};

struct Srq {
  SrqShell shell{};
  Pd* pd = nullptr;
  uint32_t max_wr = 0;
  uint32_t max_sge = 0;
  uint32_t limit = 0;  // armed SRQ limit; 0 = not armed
  std::deque<RecvWork> receives;
  int qp_refs = 0;
};

struct SendWork {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned send_flags = 0;
  bool signaled = false;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_data;  // IBV_SEND_INLINE: payload captured at post time
  bool is_inline = false;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm_data = 0;  // network order, as given
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // progress bookkeeping
  uint64_t ready_step = 0;
  unsigned rnr_naks = 0;
  unsigned transport_tries = 0;
  // The responder executed it and its acknowledgement was lost: a retry the responder recognises
  // by its PSN is acknowledged again without executing anything a second time.
  bool executed = false;
  std::vector<uint8_t> recorded_reply;  // a READ's data or an atomic's old value, for a retry
  // Over the wire (wire.cc): the request's PSN, fixed at its first try, and the try in flight.
  bool psn_assigned = false;
  uint32_t psn = 0;
  bool wire_sent = false;
  uint64_t wire_deadline_ns = 0;  // the try is lost when no answer came by then
  uint64_t wire_retry_at_ns = 0;  // after an RNR NAK: not tried again before then
};

// What a responder answers to one request (the same in-process and over the wire).
enum class Response : uint8_t { kAck = 1, kRnrNak, kRemAccessErr, kRemInvReqErr, kRemOpErr };

struct Request {
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint32_t src_qpn = 0;
  bool solicited = false;
  uint32_t imm_data = 0;  // network order, as posted
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint32_t length = 0;              // SEND/WRITE: payload bytes; READ: bytes asked; atomics: 8
  const uint8_t* payload = nullptr;  // SEND/WRITE: `length` bytes
};

struct WireResponse {
  uint32_t psn = 0;
  Response response = Response::kAck;
  std::vector<uint8_t> reply;
};

struct QpStats {
  uint64_t messages_sent = 0;      // requests that reached the peer and were acknowledged
  uint64_t messages_received = 0;  // requests this QP's responder side accepted
  uint64_t rnr_naks = 0;
  uint64_t transport_retries = 0;
  uint64_t completions_with_error = 0;
};

struct Qp {
  QpShell shell{};
  Context* ctx = nullptr;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  ibv_qp_cap cap{};
  bool sq_sig_all = false;
  bool extended = false;  // created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: ibv_qp_to_qp_ex works
  uint64_t send_ops_flags = 0;
  ibv_qp_attr attr{};  // current attributes as last modified (qp_state kept in shell too)
  // The source GID its address vector took at the modify that set it (the kernel keeps a
  // reference to that GID entry: the QP sends from it even after the slot is emptied).
  ibv_gid av_sgid{};
  uint32_t ece_options = kEceSupportedOptions;  // ibv_set_ece; back to the default at RESET
  std::deque<SendWork> send_queue;  // outstanding: not yet completed
  std::deque<RecvWork> recv_queue;
  // Receive-queue completions not written yet (recv_cqe_delay_steps): the step they are due,
  // in order (a work queue completes in order, flushes included).
  std::deque<std::pair<uint64_t, ibv_wc>> late_recv_cqes;
  QpStats stats;
  // ibv_wr_* batch being built between wr_start and wr_complete/wr_abort
  bool in_batch = false;
  int batch_error = 0;
  std::vector<SendWork> batch;
  // Over the wire (wire.cc), as a requester: whether the peer is in another process, the PSN of
  // the next new request (sq_psn at RTS), the answer to the try in flight. As a responder: the
  // PSN expected next (rq_psn at RTR) and the answers of the last READs and atomics, resent when
  // a retry of one comes (its first answer was lost).
  bool wire = false;
  uint32_t wire_next_psn = 0;
  std::optional<WireResponse> wire_response;
  uint32_t wire_expected_psn = 0;
  std::deque<WireResponse> wire_recent_replies;
};

// ---- fabric ---------------------------------------------------------------------------------

struct Fabric {
  std::mutex mutex;
  bool initialized = false;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<Qp*> qps;         // creation order = deterministic progress order
  std::map<uint32_t, Mr*> mrs;  // lkey == rkey in the fake
  std::map<int, CompChannel*> channels_by_fd;  // the event files ibv_create_comp_channel made
  uint32_t next_qp_num = 0x11;
  uint32_t next_key = 0x1000;
  uint32_t next_srq_num = 1;
  uint64_t step = 0;
  bool log = false;
  // Wire mode (VF_FAKE_VERBS_WIRE, wire.cc): this process is one host of a fabric shared with
  // other processes; it has only that host's devices.
  bool wire = false;
  int wire_host = -1;
  std::string wire_name;
};

Fabric& fabric();
std::unique_lock<std::mutex> fabric_lock();  // also makes sure devices exist
void ensure_initialized_locked();
void fake_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// What real libibverbs would turn into a silent hang or a leak (a CQ destroyed with events not
// acknowledged, a channel's struct closing another file): the fake says so and aborts, so that
// a test sees it at once.
[[noreturn]] void fake_fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// casts from public handles
inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<ContextShell*>(verbs_get_ctx(c))->impl;
}
inline Pd* to_pd(ibv_pd* p) {
  return reinterpret_cast<PdShell*>(p)->impl;
}
inline Mr* to_mr(ibv_mr* m) {
  return reinterpret_cast<MrShell*>(m)->impl;
}
inline Cq* to_cq(ibv_cq* c) {
  return reinterpret_cast<CqShell*>(c)->impl;
}
inline CompChannel* to_channel(ibv_comp_channel* c) {
  return reinterpret_cast<ChannelShell*>(c)->impl;
}
inline Qp* to_qp(ibv_qp* q) {
  return reinterpret_cast<QpShell*>(q)->impl;
}
inline Qp* to_qp(ibv_qp_ex* q) {
  return reinterpret_cast<QpShell*>(q)->impl;
}
inline Srq* to_srq(ibv_srq* s) {
  return reinterpret_cast<SrqShell*>(s)->impl;
}
inline Device* to_device(ibv_device* d) {
  return reinterpret_cast<DeviceShell*>(d)->impl;
}

// helpers implemented across files
void raise_async_event_locked(Context* ctx, const ibv_async_event& ev);
void raise_device_event_locked(Device* dev, ibv_event_type type);
void push_completion_locked(Cq* cq, const ibv_wc& wc);
Mr* find_mr_by_lkey_locked(Pd* pd, uint32_t lkey);
Mr* find_mr_by_rkey_locked(Pd* pd, uint32_t rkey);
void register_mr_locked(Mr* mr);
void unregister_mr_locked(Mr* mr);
Device* find_device_by_gid_locked(const ibv_gid& gid);
// GID 0 link-local, GID 1 the rail's IPv4-mapped address, the rest empty (init and reset).
void set_default_gids(Device& d);
// An unused slot of a GID table (all zeros, as rdma-core reports one).
bool gid_is_empty(const ibv_gid& gid);
// The address a connected QP sends from: the GID its address vector took when it was set.
const ibv_gid& source_gid_locked(const Qp* qp);
// Whether a packet from `src` to `dst` is for this connected QP, as rxe's check_addr decides:
// addressed to the QP's own source GID, from the GID it is connected to. Anything else is
// dropped (a QP re-connected from another slot of its GID table, a stale address).
bool addressed_to_locked(const Qp* qp, const ibv_gid& src, const ibv_gid& dst);
Qp* find_qp_locked(Device* dev, uint32_t qp_num);
// A completion of the QP's receive queue (success or flush): to its CQ now, or after the
// device's recv_cqe_delay_steps, never ahead of one still waiting.
void push_recv_completion_locked(Qp* qp, const ibv_wc& wc);
void move_qp_to_error_locked(Qp* qp);
void fail_head_locked(Qp* qp, ibv_wc_status status);  // head WR completes in error, QP -> ERR
void progress_step_locked();  // one deterministic progress step over all QPs
void complete_recv_error_locked(Qp* qp, const RecvWork& r, ibv_wc_status status);
// The responder's side of one request: data placed, receive consumed and completed, the answer
// (with a READ's data or an atomic's old value in `reply`).
Response respond_locked(Qp* responder, const Request& request, std::vector<uint8_t>* reply);
// The requester's side: what the answer does to the head WR; true if it finished.
bool apply_response_locked(Qp* qp, Response response, const std::vector<uint8_t>& reply);
enum class ScatterResult { kOk, kProtection, kTooLong };
// SGEs that will be written (a READ's or atomic's target, a responder's receive): each in an MR
// of `pd` with LOCAL_WRITE, together holding `len` bytes; their host addresses go to `where`.
ScatterResult check_scatter(Pd* pd, const std::vector<ibv_sge>& sges, size_t len,
                            std::vector<uint8_t*>* where);
void scatter(const std::vector<ibv_sge>& sges, const std::vector<uint8_t*>& where,
             const uint8_t* data, size_t len);
// [addr, addr+len) of an MR's address space (iova) in host memory, or nullptr.
uint8_t* translate_mr_range(Mr* mr, uint64_t addr, uint64_t len);

// wire.cc: the fabric between processes.
constexpr uint64_t kWireRnrDelayNs = 1'000'000;  // an RNR NAK's wait before the retry
constexpr uint32_t kWireMaxPayload = 64 * 1024;  // per message; more is fatal, never truncated
void wire_serve_locked();  // part of every progress step in wire mode: datagrams in and out
void wire_start_locked();  // binds this host's devices and starts the thread that serves them
// The fabric-wide index of the device holding `gid` when it is a fake device of another host
// (wire mode only), else -1.
int wire_device_index_for_gid(const ibv_gid& gid);
void wire_send_request_locked(Qp* qp, uint32_t psn, int remote_index, const Request& request);
uint64_t wire_transport_timeout_ns(uint8_t timeout);
uint64_t wire_now_ns();
int validate_and_build_send_locked(Qp* qp, const ibv_send_wr* wr, SendWork& out);
int enqueue_sends_locked(Qp* qp, std::vector<SendWork>&& works);
void fill_qp_ex_ops(ibv_qp_ex* qpx);
void fill_context_ops(ContextShell* shell);

// context ops (installed in ibv_context.ops / verbs_context)
int post_send_op(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv_op(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int post_srq_recv_op(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int poll_cq_op(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq_op(ibv_cq* cq, int solicited_only);
int query_port_op(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len);
int query_device_ex_op(ibv_context* ctx, const ibv_query_device_ex_input* input,
                       ibv_device_attr_ex* attr, size_t attr_size);
ibv_qp* create_qp_ex_op(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
ibv_cq_ex* create_cq_ex_op(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
void fill_cq_ex_ops(ibv_cq_ex* cqx);
ibv_srq* create_srq_ex_op(ibv_context* ctx, ibv_srq_init_attr_ex* attr);

// device limits advertised by ibv_query_device and enforced by create calls
constexpr int kMaxQpWr = 4096;
constexpr int kMaxSge = 16;
constexpr int kMaxCqe = 65536;
constexpr int kMaxInline = 256;
constexpr int kMaxSrqWr = 4096;
constexpr uint64_t kMaxMrSize = 1ull << 40;
constexpr uint32_t kMaxMsgSize = 1u << 30;

}  // namespace fake_verbs

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))
