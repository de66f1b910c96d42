#include "core/failover_engine.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "core/clock.h"
#include "core/control_channel.h"
#include "core/datapath_registries.h"
#include "core/device_pairs.h"
#include "core/log.h"
#include "core/object_registry.h"
#include "core/stats.h"
#include "core/verbs_names.h"
#include "core/virtual_srq.h"

namespace vf {
namespace {

constexpr std::uint8_t kMaxPorts = 4;
constexpr int kMaxDevices = 32;
constexpr int kConnectTimeoutMs = 300;
constexpr std::uint64_t kPairingAnswerTimeoutNs = 2'000'000'000;
// A re-arm request unanswered for this long is sent again (with a fresh PSN), and so is the
// answerer's notice that its port is back (PathStatus). Long enough that a late reply to the
// previous request is not mistaken for the answer to the new one. Tests may lengthen it
// (verbs_failover_debug_set_rearm_retry_ms) to prove that something does not wait for it.
constexpr std::uint64_t kRearmRetryNs = 5'000'000'000;
constexpr int kMaxGidScan = 16;
constexpr int kPairingRounds = 6;
constexpr std::uint64_t kSwitchAnswerTimeoutNs = 10'000'000'000;
constexpr std::uint64_t kSweepTimeoutNs = 2'000'000'000;
// How long an SRQ's move waits for a member whose pairing is in flight (a peer's answer takes a
// round trip; one that has not come in a second is a peer without the shim, or unreachable).
constexpr std::uint64_t kSrqPairingWaitNs = 1'000'000'000;
// How long a switch's drain waits for the old path's receive queue to flush (drain_old_path).
// A device that flushes ends the wait at once (microseconds on hardware, a few ms on rxe in the
// emulated lab). The bound is for a device that does not flush (or no longer does: a dead one);
// it is paid once per device, which is then drained without a marker. It is generous because
// giving up early can lose a message, and the engine's thread may be starved of the CPU: 50 ms
// ran out on a loaded 2-vCPU machine (the fake's late_recv_cqe, and rxe once in the lab)
// although the flush was coming.
constexpr std::uint64_t kReceiveFlushWaitNs = 1'000'000'000;
// How long the drain polls for the marker before it moves the QP to ERR a second time
// (drain_old_path): long enough for hardware to have written the flush, so that it is spared
// the extra command.
constexpr std::uint64_t kDrainMarkerNudgeNs = 200'000;
static_assert(kDrainMarkerNudgeNs < kReceiveFlushWaitNs);
// The most transport retries every provider counts: rxe takes retry_cnt 7 as "retry without end"
// (the IB spec counts 7), and a path that dies silently (no port event) must end in
// RETRY_EXC_ERR for the traffic to move. So protected QPs retry at most this often: the
// application's primary (its 7, NCCL's default, becomes 6) and the engine's standbys.
constexpr std::uint8_t kMaxRetryCount = 6;
static_assert(kMaxRetryCount < 7);
// The first hold-down of a path that failed silently, the longest, and how long a re-armed path
// must have worked for the next silent failure to start again from the first (HoldDown).
constexpr std::uint64_t kFirstHoldDownNs = 10'000'000'000ull;
constexpr std::uint64_t kMaxHoldDownNs = 600'000'000'000ull;
constexpr std::uint64_t kStableAfterRearmNs = 60'000'000'000ull;
static_assert(kFirstHoldDownNs >= kRearmRetryNs && kFirstHoldDownNs <= kMaxHoldDownNs);
// A switch after which nothing completed for this long is described in the log
// (report_late_resume). Tests may shorten it (verbs_failover_debug_set_resume_late_ms).
constexpr std::uint64_t kResumeLateNs = 5'000'000'000ull;
constexpr std::uint8_t kStandbyRdAtomic = 16;

const void* key_of(std::uint64_t value) { return reinterpret_cast<const void*>(value); }

const char* path_name(int path) { return path == kPrimary ? "primary" : "standby"; }

const char* reason_name(FailoverReason reason) {
  switch (reason) {
    case FailoverReason::kPortDown: return "port_down";
    case FailoverReason::kErrorCompletion: return "error_completion";
    case FailoverReason::kPeerRequest: return "peer_request";
    case FailoverReason::kFailback: return "failback";
  }
  return "unknown";
}

ibv_wc_opcode wc_opcode_of(ibv_wr_opcode opcode) {
  switch (opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    default: return IBV_WC_SEND;
  }
}

struct PortInfoState {
  ibv_port_state state = IBV_PORT_NOP;
  int link_layer = 0;
  ibv_mtu active_mtu = IBV_MTU_1024;
  int backup_device = -1;
  std::uint8_t backup_port = 1;
  std::uint64_t changes = 0;
  std::atomic<std::uint64_t> hidden_async_events{0};
};

struct Device {
  std::string name;
  ibv_device* device = nullptr;
  ibv_context* context = nullptr;  // the engine's own
  std::uint8_t port_count = 0;
  PortInfoState ports[kMaxPorts + 1];
  int max_qp_rd_atom = 1;
  // Whether the device flushes a receive posted to a QP in ERR (the drain marker, §5d): learnt
  // at the first switch. One that does not (rxe of older kernels) is not waited for again.
  enum class MarkerFlush { kUnknown, kYes, kNo } marker_flush = MarkerFlush::kUnknown;
};

struct MrRecord {
  ibv_mr* app_mr = nullptr;
  int device = -1;         // the application's device
  ibv_mr* shadow = nullptr;
  std::uint32_t value = 0;  // registry payload: the shadow lkey (lkey table) or rkey (rkey table)
  // What it was registered with (ibv_rereg_mr changes some of it).
  std::uint64_t iova = 0;
  unsigned int access = 0;
  int dmabuf_fd = -1;
  std::uint64_t dmabuf_offset = 0;
};

struct KeyTranslation {
  std::uint32_t value = 0;
};

struct ShadowPd {
  ibv_pd* shadow = nullptr;
  int device = -1;
};

// Where a message to the peer goes: a TCP session to another process, or this process itself
// (both ends of the pair here: a loopback or self-connected QP).
struct PeerRef {
  bool local = false;
  std::uint64_t token = 0;        // the peer process's token (its Hello)
  std::uint64_t session = 0;      // the session the pairing used
  std::vector<std::uint32_t> addresses;
  std::uint16_t port = 0;
  std::uint32_t pid = 0;
};

struct SwitchState {
  bool in_progress = false;
  int from = kPrimary;
  int to = kStandby;
  std::uint32_t epoch = 0;
  FailoverReason reason = FailoverReason::kPortDown;
  std::uint64_t detected_unix_ns = 0;
  bool local_ready = false;
  std::uint64_t local_count = 0;
  bool peer_known = false;
  std::uint64_t peer_count = 0;
  bool initiator = false;
  std::uint64_t started_monotonic_ns = 0;
};

struct Rearm {
  bool needed = false;
  bool awaiting = false;
  std::uint64_t sent_ns = 0;
  std::uint32_t nonce = 0;           // of our latest request (asker)
  // Answerer: requests up to this one are done with (answered, or sent before the asker's port
  // went down: PathStatus).
  std::uint32_t answered_nonce = 0;
  std::uint32_t seen_nonce = 0;       // answerer: of the latest request that arrived at all
  std::uint64_t notice_sent_ns = 0;   // answerer: when it last said its port is back
};

// A path that failed silently (link-class error completions, its port still ACTIVE: a cut beyond
// the port, packets dropped) looks fine to a re-arm, which only needs the port and the control
// channel: re-armed at once, it would take the traffic back and fail again, over and over. So it
// is held down before its re-arm, longer each time it fails again soon after coming back (as
// routers damp a flapping route); a port event on it (DOWN, then ACTIVE) ends the hold.
struct HoldDown {
  std::uint64_t until_ns = 0;     // no re-arm before (0: not held)
  std::uint64_t period_ns = 0;    // the latest hold's length
  std::uint64_t restored_ns = 0;  // when the path was last re-armed
};

struct QpAttrs {  // what the application gave its QP, to re-connect the primary later
  bool have_init = false, have_rtr = false, have_rts = false;
  ibv_qp_attr init{}, rtr{}, rts{};
  int init_mask = 0, rtr_mask = 0, rts_mask = 0;
};

struct Protection {
  std::unique_ptr<VirtualQp> qp;
  bool destroyed = false;  // the application destroyed the QP; kept for the stats only
  ibv_pd* app_pd = nullptr;
  QpKey local;
  QpKey remote;
  bool remote_known = false;
  bool paired = false;
  std::string unprotected_reason;
  bool warned_unprotected = false;
  PeerRef peer;
  // Paired with itself (NCCL's flush QP): kept apart from the keys, which destroy clears.
  bool self_connected = false;
  // pairing
  bool pairing = false;
  std::vector<std::pair<std::uint32_t, std::uint16_t>> candidates;
  std::size_t next_candidate = 0;
  std::uint64_t awaiting_session = 0;
  std::uint64_t awaiting_since_ns = 0;
  int pairing_rounds = 0;
  std::uint64_t retry_at_ns = 0;
  std::uint8_t peer_mtu = 0;
  // ECE: the application's primary QP's, read once when pairing starts (the application sets it
  // before RTR, and pairing starts at RTR), and the options the standby pair agreed on (vendor
  // 0: none). Each is applied again before every RTR of its QP (a reset may forget it).
  ibv_ece primary_ece{};
  bool primary_ece_read = false;
  ibv_ece standby_ece{};
  bool start_pairing_pending = false;
  bool peer_unreachable_reported = false;
  QpAttrs attrs;
  SwitchState sw;
  std::uint32_t epoch = 0;
  Rearm rearm[kPathCount];
  HoldDown hold[kPathCount];
  std::uint64_t failovers = 0;
  std::uint64_t failbacks = 0;
  std::vector<SwitchEvent> events;
  std::uint32_t pending_event = UINT32_MAX;  // index of the event awaiting its resume time
  std::uint64_t switched_monotonic_ns = 0;   // when the latest switch finished
  bool resume_late_reported = false;         // the latest switch's "no completion yet" line
};

// A shared receive queue and the protected QPs that take receives from it: they switch paths
// together (docs/design.md §5i).
struct SrqGroup {
  std::unique_ptr<VirtualSrq> srq;
  ibv_pd* pd = nullptr;
  std::vector<VirtualQp*> members;
  std::string pinned_reason;  // not empty: pass-through for good
  // A move that waits (at most kSrqPairingWaitNs) for members whose pairing is in flight and
  // whose own path still works: moving the receives without them would fail them, and a QP
  // whose pairing has not finished is unprotected, not failed. Retried by periodic_work.
  struct PassiveMember {  // a member whose peer asked for the move: it answers when it runs
    Protection* q = nullptr;
    std::uint32_t epoch = 0;
    std::uint64_t delivered = 0;
  };
  struct PendingMove {
    bool active = false;
    int target = 0;
    FailoverReason reason = FailoverReason::kPortDown;
    std::uint64_t since_ns = 0;
    std::vector<PassiveMember> passives;
  } pending;
};

struct ChannelState {
  ibv_comp_channel* app_channel = nullptr;
  ibv_comp_channel* shadow_channel = nullptr;
  int wake_fd = -1;
  std::vector<CqState*> cqs;
};

using KeyRegistry = ObjectRegistry<KeyTranslation, 1 << 17>;
using SrqRegistry = ObjectRegistry<VirtualSrq, 1 << 12>;

struct Engine {
  std::mutex mutex;
  Config config;
  VerbsApi verbs;
  std::string program;
  bool configured = false;
  bool started = false;
  bool start_failed = false;
  Device devices[kMaxDevices];
  int device_count = 0;
  std::uint64_t token = 0;
  ControlChannel channel;
  int wake_fd = -1;
  std::map<VirtualQp*, Protection> protections;
  std::vector<std::pair<std::uint32_t, std::string>> unprotected;  // qpn, reason (never virtual)
  std::map<std::pair<ibv_pd*, int>, ShadowPd> shadow_pds;
  std::map<ibv_mr*, std::unique_ptr<MrRecord>> mrs;
  std::map<std::uint64_t, std::unique_ptr<KeyTranslation>> key_storage;  // owns registry values
  std::map<std::pair<std::uint64_t, Gid>, std::uint32_t> peer_index_of;
  // Control messages the application's threads want sent: the engine's thread sends them (it
  // alone touches the network, which may block).
  std::vector<std::pair<VirtualQp*, ControlMessage>> outbox;
  std::map<ibv_cq*, std::unique_ptr<CqState>> cqs;
  std::map<ibv_srq*, SrqGroup> srqs;
  std::map<ibv_comp_channel*, ChannelState> channels;
  std::vector<std::pair<std::uint64_t, ControlMessage>> local_inbox;  // (unused token, message)
  std::uint64_t next_stats_ns = 0;
  std::uint64_t rearm_retry_ns = kRearmRetryNs;
  std::uint64_t resume_late_ns = kResumeLateNs;
  std::uint64_t first_hold_down_ns = kFirstHoldDownNs;
  std::thread::id engine_thread;
};

Engine& engine() {
  static Engine* instance = new Engine;  // never destroyed: the thread may outlive main
  return *instance;
}
VirtualQpRegistry& qps_by_address() { return datapath_registries::qps_by_address; }
QpnRegistry& qps_by_qpn() { return datapath_registries::qps_by_qpn; }
CqRegistry& cqs_by_address() { return datapath_registries::cqs_by_address; }
SrqRegistry& srqs_by_address() {
  static auto* registry = new SrqRegistry;
  return *registry;
}
KeyRegistry& lkeys() {
  static auto* registry = new KeyRegistry;
  return *registry;
}
KeyRegistry& rkeys() {
  static auto* registry = new KeyRegistry;
  return *registry;
}

std::uint64_t lkey_key(int device, std::uint32_t lkey) {
  return (static_cast<std::uint64_t>(device + 1) << 32) | lkey;
}
std::uint64_t rkey_key(std::uint64_t peer, std::uint32_t rkey) {
  return ((peer + 1) << 32) | rkey;
}

// ------------------------------------------------------------------ data-path services

bool translate_lkey(int device, std::uint32_t lkey, std::uint32_t* out) {
  const KeyTranslation* entry = lkeys().find(key_of(lkey_key(device, lkey)));
  if (entry == nullptr) return false;
  *out = entry->value;
  return true;
}

bool translate_rkey(std::uint64_t peer, std::uint32_t rkey, std::uint32_t* out) {
  const KeyTranslation* entry = rkeys().find(key_of(rkey_key(peer, rkey)));
  if (entry == nullptr) return false;
  *out = entry->value;
  return true;
}

void wake_engine() {
  const int fd = engine().wake_fd;
  if (fd >= 0) eventfd_write(fd, 1);
}

// Registry values are owned by key_storage (engine mutex held).
void put_key(KeyRegistry& registry, std::uint64_t key, std::uint32_t value) {
  Engine& e = engine();
  auto& slot = e.key_storage[key ^ (&registry == &rkeys() ? (1ull << 63) : 0)];
  if (slot) {
    slot->value = value;
    return;
  }
  slot = std::make_unique<KeyTranslation>();
  slot->value = value;
  if (!registry.insert(key_of(key), slot.get())) {
    VF_LOG_WARN("key translation table full; a registration is not usable on the standby path");
  }
}

void erase_key(KeyRegistry& registry, std::uint64_t key) {
  Engine& e = engine();
  registry.erase(key_of(key));
  // The value stays allocated: a data-path reader may hold it for a moment. Registrations are
  // few and long-lived, so the storage is reclaimed only when the key is reused.
  (void)e;
}

// ------------------------------------------------------------------ devices

Gid gid_of(const ibv_gid& gid) {
  Gid out{};
  std::memcpy(out.data(), gid.raw, out.size());
  return out;
}

ibv_gid to_ibv_gid(const Gid& gid) {
  ibv_gid out{};
  std::memcpy(out.raw, gid.data(), gid.size());
  return out;
}

int device_of_context(const ibv_context* context) {
  Engine& e = engine();
  for (int i = 0; i < e.device_count; ++i) {
    if (e.devices[i].device == context->device ||
        std::strcmp(e.devices[i].name.c_str(), context->device->name) == 0) {
      return i;
    }
  }
  return -1;
}

// The GID index the standby uses on its port: the first IPv4-mapped GID (RoCEv2 on rxe; the
// RoCE fabrics this was built for), else index 0 (InfiniBand).
int standby_gid_index(int device, std::uint8_t port, Gid* gid) {
  Engine& e = engine();
  int fallback = -1;
  Gid fallback_gid{};
  for (int index = 0; index < kMaxGidScan; ++index) {
    ibv_gid raw{};
    if (e.verbs.query_gid(e.devices[device].context, port, index, &raw) != 0) break;
    const Gid candidate = gid_of(raw);
    if (std::all_of(candidate.begin(), candidate.end(), [](std::uint8_t b) { return b == 0; })) {
      continue;
    }
    if (ipv4_of_gid(candidate) != 0) {
      *gid = candidate;
      return index;
    }
    if (fallback < 0) {
      fallback = index;
      fallback_gid = candidate;
    }
  }
  *gid = fallback_gid;
  return fallback < 0 ? 0 : fallback;
}

void discover_devices() {
  Engine& e = engine();
  int count = 0;
  ibv_device** list = e.verbs.get_device_list(&count);
  if (list == nullptr) return;
  std::vector<PortInfo> ports;
  for (int i = 0; i < count && e.device_count < kMaxDevices; ++i) {
    Device& d = e.devices[e.device_count];
    d.name = list[i]->name;
    d.device = list[i];
    d.context = e.verbs.open_device(list[i]);
    if (d.context == nullptr) {
      VF_LOG_WARN("failover: cannot open {} ({}); it is neither protected nor a backup", d.name,
                  strerror(errno));
      continue;
    }
    ibv_device_attr attr{};
    if (e.verbs.query_device(d.context, &attr) == 0) {
      d.port_count = std::min<std::uint8_t>(attr.phys_port_cnt, kMaxPorts);
      d.max_qp_rd_atom = std::max(1, attr.max_qp_rd_atom);
    }
    for (std::uint8_t port = 1; port <= d.port_count; ++port) {
      ibv_port_attr port_attr{};
      if (ibv_query_port(d.context, port, &port_attr) != 0) continue;
      d.ports[port].state = port_attr.state;
      d.ports[port].link_layer = port_attr.link_layer;
      d.ports[port].active_mtu = port_attr.active_mtu;
      ports.push_back({d.name, port, port_attr.state == IBV_PORT_ACTIVE, port_attr.link_layer});
    }
    ++e.device_count;
  }
  // The device list stays allocated: ibv_device pointers must outlive the contexts.
  std::vector<PairingRule> rules;
  if (!e.config.pairs.empty()) {
    PairsParseResult parsed = parse_device_pairs(e.config.pairs);
    for (const std::string& problem : parsed.problems) VF_LOG_WARN("{}", problem);
    rules = parsed.rules;
  } else {
    rules = automatic_pairs(ports);
  }
  for (int i = 0; i < e.device_count; ++i) {
    Device& d = e.devices[i];
    for (std::uint8_t port = 1; port <= d.port_count; ++port) {
      std::optional<PortRef> backup = backup_for(rules, PortRef{d.name, port});
      int backup_device = -1;
      if (backup) {
        for (int j = 0; j < e.device_count; ++j) {
          if (e.devices[j].name == backup->device && backup->port <= e.devices[j].port_count) {
            backup_device = j;
          }
        }
      }
      if (backup_device < 0 || (backup_device == i && backup->port == port)) {
        VF_LOG_WARN("failover: {}/{} has no usable backup port{}; its QPs run unprotected "
                    "(pass-through)",
                    d.name, port, backup ? fmt::format(" ({} not found)", backup->device) : "");
        continue;
      }
      d.ports[port].backup_device = backup_device;
      d.ports[port].backup_port = backup->port;
      VF_LOG_INFO("failover: {}/{} is backed up by {}/{}", d.name, port,
                  e.devices[backup_device].name, backup->port);
    }
  }
}

// ------------------------------------------------------------------ QP state helpers

// The application's QP: libibverbs caches the state in qp->state and some providers read that
// cache as the current state; the application must keep reading the state it set. So around
// the engine's own transitions the cache holds the physical state, then the application's again.
std::map<const ibv_qp*, ibv_qp_state>& physical_states() {
  static auto* states = new std::map<const ibv_qp*, ibv_qp_state>;
  return *states;
}

int modify(ibv_qp* qp, ibv_qp_attr* attr, int mask, bool app_qp) {
  Engine& e = engine();
  if (!app_qp) return e.verbs.modify_qp(qp, attr, mask);
  const ibv_qp_state application_view = qp->state;
  auto known = physical_states().find(qp);
  if (known != physical_states().end()) qp->state = known->second;
  const ibv_qp_state before = qp->state;
  const int result = e.verbs.modify_qp(qp, attr, mask);
  physical_states()[qp] = result == 0 && (mask & IBV_QP_STATE) ? attr->qp_state : before;
  qp->state = application_view;
  return result;
}

bool to_reset_and_init(ibv_qp* qp, std::uint8_t port, unsigned int access, bool app_qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  if (modify(qp, &attr, IBV_QP_STATE, app_qp) != 0) return false;
  attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = port;
  attr.pkey_index = 0;
  attr.qp_access_flags = access;
  return modify(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                app_qp) == 0;
}

bool to_error(ibv_qp* qp, bool app_qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(qp, &attr, IBV_QP_STATE, app_qp) == 0;
}

constexpr unsigned int kFullAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// The MTU this side offers for the standby pair: the backup port's, no larger than what the
// application gave its primary.
ibv_mtu standby_mtu(const Protection& p) {
  const PhysicalPath& standby = p.qp->path[kStandby];
  ibv_mtu mtu = engine().devices[standby.device_index].ports[standby.port].active_mtu;
  if (p.attrs.have_rtr && (p.attrs.rtr_mask & IBV_QP_PATH_MTU)) mtu = std::min(mtu, p.attrs.rtr.path_mtu);
  return mtu;
}
// RTR then RTS for one of the engine's own QPs (RoCE/IB with a GRH). 0 or the provider's errno;
// *step names the state that failed.
struct EngineQpLink {
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint32_t dest_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  Gid dest_gid{};
  int sgid_index = 0;
  std::uint8_t port = 1;
  std::uint8_t rd_atomic = 1;
  std::uint8_t timeout = 14;
  std::uint8_t rnr_retry = 7;
};
int connect_engine_qp(ibv_qp* qp, const EngineQpLink& link, const char** step) {
  Engine& e = engine();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = link.mtu;
  attr.dest_qp_num = link.dest_qpn;
  attr.rq_psn = link.rq_psn;
  attr.max_dest_rd_atomic = link.rd_atomic;
  attr.min_rnr_timer = 1;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = to_ibv_gid(link.dest_gid);
  attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(link.sgid_index);
  attr.ah_attr.grh.hop_limit = 64;
  attr.ah_attr.port_num = link.port;
  *step = "RTR";
  int result = e.verbs.modify_qp(qp, &attr,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                     IBV_QP_MIN_RNR_TIMER);
  if (result != 0) return result;
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = link.sq_psn;
  attr.timeout = link.timeout;
  attr.retry_cnt = kMaxRetryCount;
  attr.rnr_retry = link.rnr_retry;
  attr.max_rd_atomic = link.rd_atomic;
  *step = "RTS";
  return e.verbs.modify_qp(qp, &attr,
                           IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

// The application's ECE on its primary QP; vendor 0 when the provider has none (rxe, or a
// libibverbs older than ECE).
const ibv_ece& primary_ece(Protection& p) {
  Engine& e = engine();
  if (!p.primary_ece_read) {
    p.primary_ece_read = true;
    p.primary_ece = {};
    if (e.verbs.query_ece == nullptr || e.verbs.query_ece(p.qp->app_qp, &p.primary_ece) != 0) {
      p.primary_ece = {};
    }
  }
  return p.primary_ece;
}

// What the standby pair runs with: the options both primaries have. Each end computes it from
// the same two values (its own primary's and the peer's, from the pairing message), so both
// standbys agree without another round trip. None when either end has no ECE or the vendors
// differ (the options of one vendor mean nothing to another).
ibv_ece agree_ece(const ibv_ece& mine, const PairRequest& theirs) {
  if (mine.vendor_id == 0 || mine.vendor_id != theirs.ece_vendor_id) return {};
  ibv_ece agreed{};
  agreed.vendor_id = mine.vendor_id;
  agreed.options = mine.options & theirs.ece_options;
  return agreed;
}

// ECE options take effect at the QP's modify stages (ibv_set_ece(3)): set before RTR. 0 or errno.
int apply_ece(ibv_qp* qp, const ibv_ece& ece) {
  if (ece.vendor_id == 0) return 0;
  Engine& e = engine();
  if (e.verbs.set_ece == nullptr) return EOPNOTSUPP;
  ibv_ece copy = ece;
  return e.verbs.set_ece(qp, &copy);
}

// Connects the standby QP to the peer's standby (RTR then RTS).
bool connect_standby(Protection& p, std::uint32_t dest_qpn, const Gid& dest_gid,
                     std::uint32_t dest_psn, std::uint8_t peer_mtu) {
  Engine& e = engine();
  PhysicalPath& standby = p.qp->path[kStandby];
  const Device& device = e.devices[standby.device_index];
  EngineQpLink link;
  link.mtu = standby_mtu(p);
  if (peer_mtu != 0) link.mtu = std::min(link.mtu, static_cast<ibv_mtu>(peer_mtu));
  link.dest_qpn = dest_qpn;
  link.rq_psn = dest_psn;
  link.sq_psn = standby.psn;
  link.dest_gid = dest_gid;
  link.sgid_index = standby.gid_index;
  link.port = standby.port;
  link.rd_atomic = static_cast<std::uint8_t>(std::min<int>(kStandbyRdAtomic, device.max_qp_rd_atom));
  link.timeout = e.config.qp_timeout;
  if (const int result = apply_ece(standby.qp, p.standby_ece); result != 0) {
    VF_LOG_WARN("qp {}: standby qp {} refused ECE options {:#x} of vendor {:#x}, which its primary "
                "and the peer's run with ({})", p.qp->vqpn, standby.qp->qp_num, p.standby_ece.options,
                p.standby_ece.vendor_id, strerror(result));
    return false;
  }
  const char* step = "";
  const int result = connect_engine_qp(standby.qp, link, &step);
  if (result != 0) {
    VF_LOG_WARN("qp {}: standby qp {} to {} failed ({})", p.qp->vqpn, standby.qp->qp_num, step,
                strerror(result));
    return false;
  }
  return true;
}

// Re-connects the application's own QP after a reset (RTR/RTS with the application's attributes
// and fresh PSNs).
bool connect_primary(Protection& p, std::uint32_t dest_qpn, std::uint32_t dest_psn) {
  Engine& e = engine();
  VirtualQp& v = *p.qp;
  if (!p.attrs.have_rtr || !p.attrs.have_rts) return false;
  if (p.primary_ece_read) {  // what the application set before its RTR, again after the reset
    if (const int result = apply_ece(v.app_qp, p.primary_ece); result != 0) {
      VF_LOG_WARN("qp {}: its ECE options {:#x} could not be set again after the reset ({})", v.vqpn,
                  p.primary_ece.options, strerror(result));
      return false;
    }
  }
  ibv_qp_attr attr = p.attrs.rtr;
  attr.qp_state = IBV_QPS_RTR;
  attr.dest_qp_num = dest_qpn;
  attr.rq_psn = dest_psn;
  int mask = p.attrs.rtr_mask | IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (modify(v.app_qp, &attr, mask, true) != 0) return false;
  attr = p.attrs.rts;
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = v.path[kPrimary].psn;
  mask = p.attrs.rts_mask | IBV_QP_STATE | IBV_QP_SQ_PSN;
  (void)e;
  return modify(v.app_qp, &attr, mask, true) == 0;
}

std::uint32_t random_psn() {
  static thread_local std::mt19937 generator{std::random_device{}()};
  return generator() & 0xffffff;
}

// ------------------------------------------------------------------ messages

void process_message(const PeerRef& from, std::uint64_t session, ControlMessage& message);
void flush_outbox();

// To this process's inbox, or on a session to the peer that exists: never connects.
bool send_on_open_session(Protection& p, const ControlMessage& message) {
  Engine& e = engine();
  if (p.peer.local) {
    e.local_inbox.emplace_back(0, message);
    wake_engine();
    return true;
  }
  ControlSession* session = e.channel.find_by_token(p.peer.token);
  if (session == nullptr) session = e.channel.find(p.peer.session);
  return session != nullptr && e.channel.send(session->id, message);
}

bool send_to_peer(Protection& p, const ControlMessage& message) {
  Engine& e = engine();
  if (send_on_open_session(p, message)) {
    if (!p.peer.local) p.peer_unreachable_reported = false;
    return true;
  }
  // Every session to the peer is gone: reach it on any address it advertised.
  for (std::uint32_t address : p.peer.addresses) {
    std::string error;
    const std::uint64_t id = e.channel.connect(address, p.peer.port, kConnectTimeoutMs, error);
    if (id == 0) {
      VF_LOG_DEBUG("control: reconnect to {}:{} failed ({})", ipv4_text(address), p.peer.port,
                   error);
      continue;
    }
    p.peer.session = id;
    if (e.channel.send(id, message)) return true;
  }
  if (!p.peer_unreachable_reported) {  // once, not at every retry
    p.peer_unreachable_reported = true;
    VF_LOG_ERROR("qp {}: the peer's shim (pid {}) cannot be reached on any of its addresses",
                 p.qp->vqpn, p.peer.pid);
  }
  return false;
}

PairRequest describe_standby(Protection& p) {
  Engine& e = engine();
  PairRequest request;
  request.local = p.local;
  request.remote = p.remote;
  const PhysicalPath& standby = p.qp->path[kStandby];
  request.standby_qpn = standby.qp->qp_num;
  request.standby_gid = standby.gid;
  request.standby_psn = standby.psn;
  request.path_mtu = static_cast<std::uint8_t>(standby_mtu(p));
  const ibv_ece& ece = primary_ece(p);
  request.ece_vendor_id = ece.vendor_id;
  request.ece_options = ece.vendor_id != 0 ? ece.options : 0;
  // The registrations of the QP's device: the peer translates our rkeys with them.
  for (const auto& [mr, record] : e.mrs) {
    if (record->device != p.qp->path[kPrimary].device_index || record->shadow == nullptr) continue;
    if (request.registrations.size() >= kMaxRegistrationsPerMessage) break;
    request.registrations.push_back({reinterpret_cast<std::uintptr_t>(mr->addr), mr->length,
                                     mr->rkey, record->shadow->rkey});
  }
  return request;
}

// rkeys are per device: a translation table per (peer process, peer device), the device named
// by the GID its QPs carry. Peers inside this process have one table per local device.
std::uint32_t peer_index(std::uint64_t token, const Gid& device_gid) {
  Engine& e = engine();
  auto [it, inserted] = e.peer_index_of.try_emplace(
      std::make_pair(token, device_gid), static_cast<std::uint32_t>(e.peer_index_of.size() + 1));
  return it->second;
}
std::uint32_t local_peer_index(int device) { return 0x100000u + static_cast<std::uint32_t>(device); }

void learn_translations(std::uint64_t peer, const std::vector<MrTranslation>& list) {
  for (const MrTranslation& entry : list) {
    if (entry.length == 0) {
      erase_key(rkeys(), rkey_key(peer, entry.primary_rkey));
    } else {
      put_key(rkeys(), rkey_key(peer, entry.primary_rkey), entry.standby_rkey);
    }
  }
}

void mark_protected(Protection& p) {
  VirtualQp& v = *p.qp;
  p.paired = true;
  p.pairing = false;
  v.path[kPrimary].connected = true;
  v.path[kStandby].connected = true;
  p.unprotected_reason.clear();
  VF_LOG_INFO("qp {}: protected — standby qp {} on {}/{} paired with the peer's qp {} {}{}",
              v.vqpn, v.path[kStandby].qp->qp_num,
              engine().devices[v.path[kStandby].device_index].name, v.path[kStandby].port,
              p.remote.qpn,
              p.peer.local ? std::string("(same process)")
                           : fmt::format("(pid {} at {})", p.peer.pid,
                                         p.peer.addresses.empty() ? std::string("?")
                                                                  : ipv4_text(p.peer.addresses[0])),
              p.standby_ece.vendor_id == 0
                  ? std::string()
                  : fmt::format(", ECE options {:#x} of vendor {:#x}", p.standby_ece.options,
                                p.standby_ece.vendor_id));
}

void set_unprotected(Protection& p, std::string reason) {
  if (p.unprotected_reason == reason) return;
  p.unprotected_reason = std::move(reason);
  VF_LOG_WARN("qp {}: unprotected — {}", p.qp->vqpn, p.unprotected_reason);
}

bool gid_of_port(int device, std::uint8_t port, const Gid& gid) {
  Engine& e = engine();
  for (int index = 0; index < kMaxGidScan; ++index) {
    ibv_gid raw{};
    if (e.verbs.query_gid(e.devices[device].context, port, index, &raw) != 0) return false;
    if (gid_of(raw) == gid) return true;
  }
  return false;
}

// The protected QP a peer names by (QPN, GID). A QP the application has not moved to RTR yet
// (its GID index is not known) is found by its QPN and any GID of its port: a peer that reached
// RTR first must not be refused.
Protection* protection_by_key(const QpKey& key) {
  Engine& e = engine();
  for (auto& [v, p] : e.protections) {
    if (p.destroyed) continue;
    if (p.local == key) return &p;
  }
  for (auto& [v, p] : e.protections) {
    if (p.destroyed || p.local.qpn != 0 || v->vqpn != key.qpn) continue;
    if (gid_of_port(v->path[kPrimary].device_index, v->path[kPrimary].port, key.gid)) {
      p.local = key;
      v->path[kPrimary].gid = key.gid;
      return &p;
    }
  }
  return nullptr;
}

// The standby pair is connected from the peer's description (request or reply).
bool accept_peer_standby(Protection& p, const PairRequest& theirs) {
  if (p.paired) return true;
  p.standby_ece = agree_ece(primary_ece(p), theirs);
  if (p.primary_ece.vendor_id != 0 && p.standby_ece.vendor_id == 0) {
    VF_LOG_INFO("qp {}: the standby pair runs without ECE: the peer's primary has {}", p.qp->vqpn,
                theirs.ece_vendor_id == 0 ? std::string("none")
                                          : fmt::format("vendor {:#x}, not {:#x}",
                                                        theirs.ece_vendor_id, p.primary_ece.vendor_id));
  }
  if (!connect_standby(p, theirs.standby_qpn, theirs.standby_gid, theirs.standby_psn,
                       theirs.path_mtu)) {
    set_unprotected(p, "the standby QP could not be connected");
    return false;
  }
  if (!p.peer.local) learn_translations(p.qp->peer, theirs.registrations);
  mark_protected(p);
  return true;
}

void handle_pair_request(const PeerRef& from, std::uint64_t session, const PairRequest& request) {
  Engine& e = engine();
  Protection* p = protection_by_key(request.remote);
  auto refuse = [&](PairRefusal reason) {
    PairRefused refused{request.remote, request.local, static_cast<std::uint32_t>(reason)};
    if (from.local) {
      e.local_inbox.emplace_back(0, refused);
    } else {
      e.channel.send(session, refused);
    }
  };
  if (p == nullptr) return refuse(PairRefusal::kUnknownQp);
  if (p->qp->path[kStandby].qp == nullptr || p->qp->mode() == PostMode::kBypass) {
    return refuse(PairRefusal::kUnprotected);
  }
  p->peer = from;
  if (!from.local) p->peer.session = session;
  p->qp->peer = peer_index(from.token, request.local.gid);
  if (!p->remote_known) {
    p->remote = request.local;
    p->remote_known = true;
  }
  if (!accept_peer_standby(*p, request)) return refuse(PairRefusal::kUnprotected);
  PairReply reply{describe_standby(*p)};
  if (from.local) {
    e.local_inbox.emplace_back(0, reply);
    wake_engine();
  } else {
    e.channel.send(session, reply);
  }
}

void try_next_candidate(Protection& p);
SrqGroup* group_of(const VirtualQp& v);
void pin_srq_group(SrqGroup& g, const std::string& why);

// Pairing failed for good: the QP runs pass-through, and so does an SRQ it takes receives from
// (the SRQ could not move without it).
void pairing_failed(Protection& p, std::string reason) {
  p.pairing = false;
  if (SrqGroup* group = group_of(*p.qp)) {
    pin_srq_group(*group, fmt::format("qp {} on it could not be paired", p.qp->vqpn));
  }
  set_unprotected(p, std::move(reason));
}

void handle_pair_reply(const PeerRef& from, std::uint64_t session, const PairReply& reply) {
  Protection* p = protection_by_key(reply.pair.remote);
  if (p == nullptr || p->paired) return;
  p->peer = from;
  if (!from.local) p->peer.session = session;
  p->qp->peer = peer_index(from.token, reply.pair.local.gid);
  accept_peer_standby(*p, reply.pair);
}

void handle_pair_refused(const PairRefused& refused) {
  Protection* p = protection_by_key(refused.remote);
  if (p == nullptr || p->paired || !p->pairing) return;
  if (refused.reason == static_cast<std::uint32_t>(PairRefusal::kUnprotected)) {
    pairing_failed(*p, "the peer's shim has no standby for its QP (no backup device there)");
    return;
  }
  p->awaiting_session = 0;
  try_next_candidate(*p);
}

// Local pairing: both QPs are in this process (loopback, or NCCL's self-connected flush QP).
bool pair_locally(Protection& p) {
  Protection* other = protection_by_key(p.remote);
  if (other == nullptr) return false;
  PeerRef self;
  self.local = true;
  p.peer = self;
  other->peer = self;
  p.self_connected = other == &p;
  p.qp->peer = local_peer_index(other->qp->path[kPrimary].device_index);
  other->qp->peer = local_peer_index(p.qp->path[kPrimary].device_index);
  if (other->qp->path[kStandby].qp == nullptr || other->qp->mode() == PostMode::kBypass) {
    p.pairing = false;
    set_unprotected(p, "its peer QP in this process is unprotected");
    return true;
  }
  if (!other->remote_known) {
    other->remote = p.local;
    other->remote_known = true;
  }
  const PairRequest mine = describe_standby(p);
  const PairRequest theirs = describe_standby(*other);
  if (other != &p) accept_peer_standby(*other, mine);
  accept_peer_standby(p, theirs);
  return true;
}

void try_next_candidate(Protection& p) {
  Engine& e = engine();
  while (p.next_candidate < p.candidates.size()) {
    const auto [address, port] = p.candidates[p.next_candidate++];
    ControlSession* session = e.channel.find_by_endpoint(address, port);
    std::uint64_t id = session != nullptr ? session->id : 0;
    if (id == 0) {
      // Not waited for: a connection that fails later closes its session, and the close
      // handler moves on to the next candidate.
      std::string error;
      id = e.channel.connect_async(address, port, kConnectTimeoutMs, error);
      if (id == 0) continue;  // refused at once
    }
    if (!e.channel.send(id, describe_standby(p))) continue;
    p.awaiting_session = id;
    p.awaiting_since_ns = monotonic_ns();
    return;
  }
  // Nobody answered for this QP: the peer may not run the shim, or not be reachable.
  p.awaiting_session = 0;
  if (++p.pairing_rounds < kPairingRounds) {
    // 0.5, 1, 2, 4, 8 s: a peer process that starts late still pairs.
    p.retry_at_ns = monotonic_ns() + (500'000'000ull << (p.pairing_rounds - 1));
    p.next_candidate = 0;
    return;
  }
  pairing_failed(p, "no peer shim answered for it (is the peer running verbs-failover, and is "
                    "the control port reachable? VERBS_FAILOVER_CTRL_ADDRS)");
}

void start_pairing(Protection& p) {
  Engine& e = engine();
  p.pairing = true;
  p.pairing_rounds = 0;
  p.next_candidate = 0;
  if (pair_locally(p)) return;
  p.candidates.clear();
  std::vector<std::uint32_t> addresses;
  if (const std::uint32_t address = ipv4_of_gid(p.remote.gid); address != 0) {
    addresses.push_back(address);
  }
  for (const std::string& text : e.config.ctrl_peer_addresses) {
    in_addr parsed{};
    if (inet_pton(AF_INET, text.c_str(), &parsed) == 1) addresses.push_back(parsed.s_addr);
  }
  if (addresses.empty()) {
    p.pairing = false;
    set_unprotected(p, "the peer's GID holds no IPv4 address and VERBS_FAILOVER_CTRL_ADDRS names "
                       "no peer address");
    return;
  }
  for (std::uint32_t address : addresses) {
    for (std::uint32_t port = e.config.ctrl_port_first; port <= e.config.ctrl_port_last; ++port) {
      p.candidates.emplace_back(address, static_cast<std::uint16_t>(port));
    }
  }
  try_next_candidate(p);
}

// ------------------------------------------------------------------ switching

// Back to INIT on its port, ready to be connected again: the application's QP with the access
// flags the application gave it, the standby with all of them.
bool reset_path(Protection& p, int path) {
  PhysicalPath& physical = p.qp->path[path];
  const unsigned int access = path == kPrimary && (p.attrs.init_mask & IBV_QP_ACCESS_FLAGS)
                                  ? p.attrs.init.qp_access_flags
                                  : kFullAccess;
  return to_reset_and_init(physical.qp, physical.port, access, path == kPrimary);
}

void post_switch_reset(Protection& p, int old_path) {
  VirtualQp& v = *p.qp;
  PhysicalPath& old = v.path[old_path];
  old.connected = false;
  const std::uint64_t start = monotonic_ns();
  if (!reset_path(p, old_path)) {
    VF_LOG_WARN("qp {}: resetting the {} QP for later re-use failed", v.vqpn, path_name(old_path));
  }
  VF_LOG_DEBUG("qp {}: the {} QP reset for re-use in {:.3f} ms", v.vqpn, path_name(old_path),
               static_cast<double>(monotonic_ns() - start) / 1e6);
  p.rearm[old_path].needed = true;
  p.rearm[old_path].awaiting = false;
}

void finish_switch(Protection& p) {
  Engine& e = engine();
  VirtualQp& v = *p.qp;
  SwitchState& sw = p.sw;
  std::vector<const SendRecord*> replay, unrecoverable;
  std::uint64_t replayed = 0, synthesized = 0;
  v.send_cq->lock.lock();
  v.lock().lock();
  if (!v.send_ring().replay_set(sw.peer_count, replay, unrecoverable)) {
    VF_LOG_ERROR("qp {}: the peer reports {} messages delivered but only {} were posted; "
                 "replaying everything outstanding",
                 v.vqpn, sw.peer_count, v.send_ring().messages_posted());
    v.send_ring().replay_set(0, replay, unrecoverable);
  }
  std::vector<std::uint64_t> keep;
  keep.reserve(replay.size());
  for (const SendRecord* record : replay) keep.push_back(record->sequence);
  const std::uint64_t posted_before = v.next_send_to_post();
  // What the peer proved done completes now (its acknowledgement was lost with the path), in
  // order; atomics that may have executed complete with an error (docs/design.md §5).
  v.send_ring().for_each([&](const SendRecord& record) {
    if (record.sequence >= posted_before) return;  // never posted: nothing to prove
    const bool replaying = std::binary_search(keep.begin(), keep.end(), record.sequence);
    if (replaying) return;
    const bool atomic = record.is_atomic();
    if (!record.signaled && !atomic) return;
    ibv_wc wc{};
    wc.wr_id = record.wr.wr_id;
    wc.status = atomic ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS;
    wc.opcode = wc_opcode_of(record.wr.opcode);
    wc.qp_num = v.vqpn;
    if (atomic) {
      VF_LOG_ERROR("qp {}: atomic wr_id={:#x} was in flight when the {} path failed; whether it "
                   "executed cannot be known, so it completes with an error",
                   v.vqpn, record.wr.wr_id, path_name(sw.from));
    }
    if (v.send_cq->stash_for_application(wc)) ++synthesized;
  });
  v.send_ring().compact([&](const SendRecord& record) {
    return record.sequence >= posted_before ||
           std::binary_search(keep.begin(), keep.end(), record.sequence);
  });
  replayed = keep.size();
  std::uint64_t first = v.send_ring().next_sequence();
  v.send_ring().for_each_from(0, [&](const SendRecord& record) {
    first = record.sequence;
    return false;
  });
  v.restart_sends(first);
  v.set_holding(false);
  v.link_error_seen.store(false);
  v.drop_held_errors();  // replaced by the replay
  v.post_pending();
  if (v.send_ring().outstanding() == 0 && v.recv_ring().pending() == 0) {
    // Nothing to wait for on this side (a passive RDMA target): its traffic resumed with the
    // switch itself.
    v.counters.resumed_unix_ns.store(realtime_ns(), std::memory_order_relaxed);
  } else {
    v.awaiting_resume.store(true, std::memory_order_relaxed);
  }
  if (sw.to == kPrimary && !v.application_failed.load()) v.set_mode(PostMode::kDirect);
  v.lock().unlock();
  v.send_cq->lock.unlock();

  v.counters.replayed_wrs.fetch_add(replayed, std::memory_order_relaxed);
  v.counters.synthesized_completions.fetch_add(synthesized, std::memory_order_relaxed);
  if (sw.reason == FailoverReason::kFailback) {
    ++p.failbacks;
  } else {
    ++p.failovers;
  }
  SwitchEvent event;
  event.kind = sw.reason == FailoverReason::kFailback ? "failback" : "failover";
  event.reason = reason_name(sw.reason);
  event.from = path_name(sw.from);
  event.to = path_name(sw.to);
  event.detected_unix_ns = sw.detected_unix_ns;
  event.replayed_wrs = replayed;
  p.events.push_back(event);
  p.pending_event = static_cast<std::uint32_t>(p.events.size() - 1);
  p.switched_monotonic_ns = monotonic_ns();
  p.resume_late_reported = false;
  VF_LOG_INFO("qp {}: {} {} -> {} done ({}): peer had delivered {} message(s), we {}; replayed "
              "{} request(s), completed {} proven done, in {:.3f} ms",
              v.vqpn, event.kind, event.from, event.to, event.reason, sw.peer_count,
              sw.local_count, replayed, synthesized,
              static_cast<double>(monotonic_ns() - sw.started_monotonic_ns) / 1e6);
  const int old_path = sw.from;
  sw.in_progress = false;
  post_switch_reset(p, old_path);
  (void)e;
}

// This side's half: stop the old path, take what it completed, count what it delivered, move
// the receives. Returns false if the switch cannot happen.
// Posts the drain marker on a path's QP that is in ERR. Not for a QP on an SRQ: it has no
// receive queue of its own to flush (an SRQ is never flushed).
bool post_drain_marker(Protection& p, int path) {
  VirtualQp& v = *p.qp;
  if (v.srq != nullptr) return false;
  if (engine().devices[v.path[path].device_index].marker_flush == Device::MarkerFlush::kNo) {
    return false;
  }
  ibv_qp* qp = v.path[path].qp;
  v.lock().lock();
  v.clear_drain_marker(path);
  v.lock().unlock();
  ibv_recv_wr marker{};
  marker.wr_id = kDrainMarkerWrId;
  ibv_recv_wr* bad = nullptr;
  const int result = engine().verbs.provider_ops(qp->context)->post_recv(qp, &marker, &bad);
  if (result != 0) {
    VF_LOG_DEBUG("qp {}: no drain marker on the {} path ({}); its drain takes what is there",
                 v.vqpn, path_name(path), strerror(result));
    return false;
  }
  return true;
}

// Takes every completion the old path will ever report into the stash, before the delivered
// count is read. A device may write a receive's completion after it acknowledged the message
// (the sender has its success and retires the request): a drain that stopped at the first empty
// poll would count one message fewer, and the peer would have nothing left to replay. So the
// drain goes on until the marker's flush shows the receive queue has reported everything, at
// most kReceiveFlushWaitNs (a device that does not flush a QP in ERR must not stall the switch).
// A QP that could not be moved to ERR gets no marker: it would be an ordinary receive there, one
// an arriving message could consume.
void drain_old_path(Protection& p, int from, bool in_error) {
  VirtualQp& v = *p.qp;
  const bool marked = in_error && post_drain_marker(p, from);
  const std::uint64_t start = monotonic_ns();
  const std::uint64_t deadline = start + kReceiveFlushWaitNs;
  bool nudged = false;
  for (unsigned round = 1;; ++round) {
    v.send_cq->drain_into_stash(from);
    if (v.recv_cq != v.send_cq) v.recv_cq->drain_into_stash(from);
    if (!marked) return;
    v.lock().lock();
    const bool seen = v.drain_marker_seen(from);
    v.lock().unlock();
    Device& device = engine().devices[v.path[from].device_index];
    if (seen) {
      device.marker_flush = Device::MarkerFlush::kYes;
      return;
    }
    const std::uint64_t now = monotonic_ns();
    if (!nudged && now - start >= kDrainMarkerNudgeNs) {
      // rxe flushes a receive queue only when its responder runs in ERR, which the move to ERR
      // schedules once: a marker posted after that run stays until the next. Moving the QP to
      // ERR again (ERR -> ERR is a legal transition) schedules another; on a device that
      // flushes by itself it only costs the call.
      nudged = true;
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      const int result = modify(v.path[from].qp, &attr, IBV_QP_STATE, from == kPrimary);
      if (result != 0) {
        VF_LOG_DEBUG("qp {}: moving the {} path to ERR again failed ({})", v.vqpn,
                     path_name(from), strerror(result));
      }
    }
    if (now >= deadline) {
      // Remembered whatever the device did before: a device that stopped flushing (one that
      // died) must not charge the full wait to each of its QPs in turn, with the engine's
      // lock held.
      const Device::MarkerFlush before = device.marker_flush;
      device.marker_flush = Device::MarkerFlush::kNo;
      if (before == Device::MarkerFlush::kUnknown) {
        VF_LOG_WARN("failover: {} does not flush a receive posted to a QP in ERR (waited {} ms, "
                    "qp {}); its switches drain what its CQ holds, and a receive completion it "
                    "writes after its ACK would not be counted",
                    device.name, kReceiveFlushWaitNs / 1'000'000, v.vqpn);
      } else {
        VF_LOG_WARN("qp {}: the {} path's receive queue did not flush within {} ms of ERR; a "
                    "receive completion its device writes later is not counted, and {}'s "
                    "switches drain without a marker from now on",
                    v.vqpn, path_name(from), kReceiveFlushWaitNs / 1'000'000, device.name);
      }
      return;
    }
    // Polls back to back (a flush takes microseconds), giving the CPU away now and then.
    if (round % 64 == 0) sched_yield();
  }
}

void begin_switch(Protection& p, int target, FailoverReason reason, std::uint32_t epoch,
                  bool initiator) {
  VirtualQp& v = *p.qp;
  SwitchState& sw = p.sw;
  const int from = v.active_path();
  sw = SwitchState{};
  sw.in_progress = true;
  sw.from = from;
  sw.to = target;
  sw.epoch = epoch;
  sw.reason = reason;
  sw.initiator = initiator;
  sw.detected_unix_ns = realtime_ns();
  sw.started_monotonic_ns = monotonic_ns();
  p.epoch = epoch;
  VF_LOG_INFO("qp {}: switching {} -> {} ({}, epoch {})", v.vqpn, path_name(from),
              path_name(target), reason_name(reason), epoch);
  v.lock().lock();
  v.set_mode(PostMode::kRouted);
  v.set_holding(true);
  v.lock().unlock();
  // After this the old path's responder drops whatever still arrives: nothing the peer sends
  // on it can be delivered behind our count.
  const std::uint64_t stop_start = monotonic_ns();
  ibv_qp_attr stop{};
  stop.qp_state = IBV_QPS_ERR;
  const int stop_result = modify(v.path[from].qp, &stop, IBV_QP_STATE, from == kPrimary);
  const bool in_error = stop_result == 0;
  if (!in_error) {
    VF_LOG_WARN("qp {}: the {} path could not be moved to ERR ({}); its drain takes what its CQ "
                "holds", v.vqpn, path_name(from), strerror(stop_result));
  }
  const std::uint64_t drain_start = monotonic_ns();
  drain_old_path(p, from, in_error);
  VF_LOG_DEBUG("qp {}: the {} path stopped (ERR {:.3f} ms, drained {:.3f} ms)", v.vqpn,
               path_name(from), static_cast<double>(drain_start - stop_start) / 1e6,
               static_cast<double>(monotonic_ns() - drain_start) / 1e6);
  if (target == kStandby) {
    v.send_cq->shadow_active.store(true);
    v.recv_cq->shadow_active.store(true);
  }
  v.lock().lock();
  v.set_accepting(from, false);
  sw.local_count = v.recv_ring().delivered_messages();
  v.set_active_path(target);
  v.set_accepting(target, true);
  v.restart_receives();
  v.post_pending(false);
  v.link_error_seen.store(false);
  v.lock().unlock();
  sw.local_ready = true;
}

bool can_switch_to(const Protection& p, int target) {
  const VirtualQp& v = *p.qp;
  return p.paired && v.path[target].connected && !v.path[target].failed &&
         !v.application_failed.load() && v.mode() != PostMode::kBypass;
}

// No switch will happen: the error completions hidden for one reach the application, and the
// QP runs pass-through from here (the application gets the error it would have got).
void release_held_errors(Protection& p) {
  VirtualQp& v = *p.qp;
  std::vector<VirtualQp::HeldError> held;
  v.lock().lock();
  v.take_held_errors(held);
  if (v.active_path() == kPrimary) v.set_mode(PostMode::kBypass);
  v.application_failed.store(true);
  v.lock().unlock();
  for (const VirtualQp::HeldError& error : held) {
    error.cq->lock.lock();
    error.cq->stash_for_application(error.wc);
    error.cq->lock.unlock();
  }
  if (!held.empty()) {
    VF_LOG_WARN("qp {}: {} error completion(s) go to the application: no path is left", v.vqpn,
                held.size());
  }
}

// A switch whose peer never answers (its process is gone, the control channel is cut both ways):
// the application gets what it would have got without the shim — the old path's error
// completions (held), and a flush error for every signaled request it posted during the switch
// that reached no QP.
void abort_switch(Protection& p, const char* why) {
  VirtualQp& v = *p.qp;
  VF_LOG_ERROR("qp {}: the switch to the {} path cannot complete ({}); the application sees the "
               "failure",
               v.vqpn, path_name(p.sw.to), why);
  std::vector<ibv_wc> flushed;
  v.lock().lock();
  v.send_ring().for_each_from(v.next_send_to_post(), [&](const SendRecord& record) {
    if (record.signaled) {
      ibv_wc wc{};
      wc.wr_id = record.wr.wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = wc_opcode_of(record.wr.opcode);
      wc.qp_num = v.vqpn;
      flushed.push_back(wc);
    }
    return true;
  });
  v.set_holding(false);
  v.set_mode(PostMode::kBypass);
  // Pass-through posts go to the application's own QP: its completions (flushes, on a dead
  // path) are the application's again.
  v.set_active_path(kPrimary);
  v.set_accepting(kPrimary, true);
  v.lock().unlock();
  p.sw.in_progress = false;
  release_held_errors(p);
  v.send_cq->lock.lock();
  for (const ibv_wc& wc : flushed) v.send_cq->stash_for_application(wc);
  v.send_cq->lock.unlock();
  set_unprotected(p, fmt::format("a switch failed ({})", why));
}

// ------------------------------------------------------------------ shared receive queues

SrqGroup* group_of(const VirtualQp& v) {
  if (v.srq == nullptr) return nullptr;
  auto it = engine().srqs.find(v.srq->app_srq);
  return it == engine().srqs.end() ? nullptr : &it->second;
}

// Empties a path's SRQ of the receives that moved away from it (an SRQ is never flushed, and a
// receive left there would be handed out a second time): a loopback pair of the engine's QPs,
// one attached to that SRQ, sends zero-length messages into it until the responder has no
// receive left (an RNR with no retry). Zero-length messages write nothing into the buffers.
bool sweep_srq(SrqGroup& g, int path) {
  Engine& e = engine();
  VirtualSrq& srq = *g.srq;
  ibv_srq* target = path == kPrimary ? srq.app_srq : srq.shadow;
  const int device = path == kPrimary ? srq.device_index : srq.shadow_device_index;
  if (target == nullptr || device < 0 || g.members.empty()) return false;
  const std::uint8_t port = g.members.front()->path[path].port;
  ibv_pd* pd = target->pd;
  ibv_context* context = target->context;
  const ibv_context_ops* ops = e.verbs.provider_ops(context);
  ibv_cq* cq = e.verbs.create_cq(context, 64, nullptr, nullptr, 0);
  if (cq == nullptr) return false;
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* sender = e.verbs.create_qp(pd, &init);
  init.srq = target;
  init.cap.max_recv_wr = 0;
  init.cap.max_recv_sge = 0;
  ibv_qp* receiver = sender != nullptr ? e.verbs.create_qp(pd, &init) : nullptr;
  Gid gid{};
  const int gid_index = standby_gid_index(device, port, &gid);
  auto connect = [&](ibv_qp* qp, std::uint32_t dest) {
    if (!to_reset_and_init(qp, port, kFullAccess, false)) return false;
    EngineQpLink link;
    link.dest_qpn = dest;
    link.dest_gid = gid;
    link.sgid_index = gid_index;
    link.port = port;
    link.timeout = 10;
    link.rnr_retry = 0;  // the first RNR ends the sweep: the SRQ is empty
    const char* step = "";
    return connect_engine_qp(qp, link, &step) == 0;
  };
  bool empty = false;
  std::uint64_t swept = 0;
  const char* failure = "its loopback QPs could not be created or connected";
  if (receiver != nullptr && connect(sender, receiver->qp_num) && connect(receiver, sender->qp_num)) {
    failure = nullptr;
    const std::uint64_t deadline = monotonic_ns() + kSweepTimeoutNs;
    const std::uint64_t bound = static_cast<std::uint64_t>(srq.max_wr) * VirtualSrq::kSlack + 64;
    while (!empty && failure == nullptr && swept <= bound) {
      constexpr int kBatch = 16;
      int posted = 0;
      for (; posted < kBatch; ++posted) {
        ibv_send_wr wr{};
        ibv_send_wr* bad = nullptr;
        wr.wr_id = static_cast<std::uint64_t>(posted);
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        if (ops->post_send(sender, &wr, &bad) != 0) break;
      }
      if (posted == 0) {
        failure = "posting to its loopback QP failed";
        break;
      }
      int completed = 0;
      while (completed < posted && failure == nullptr) {
        ibv_wc wc[16];
        const int n = ops->poll_cq(cq, 16, wc);
        if (n < 0) failure = "polling its loopback CQ failed";
        for (int i = 0; i < n; ++i) {
          if (wc[i].qp_num != sender->qp_num) continue;  // a swept receive: nobody's now
          ++completed;
          if (wc[i].status == IBV_WC_SUCCESS) {
            ++swept;
          } else if (wc[i].status == IBV_WC_RNR_RETRY_EXC_ERR) {
            empty = true;
          } else if (!empty && wc[i].status != IBV_WC_WR_FLUSH_ERR) {
            failure = "its loopback send failed";
          }
        }
        if (monotonic_ns() > deadline) failure = "it did not finish within 2 s";
      }
    }
    if (!empty && failure == nullptr) failure = "it held more receives than it can";
  }
  if (receiver != nullptr) e.verbs.destroy_qp(receiver);
  if (sender != nullptr) e.verbs.destroy_qp(sender);
  e.verbs.destroy_cq(cq);
  if (failure != nullptr) {
    VF_LOG_ERROR("srq {:#x}: sweeping the {} SRQ failed ({}); receives are not moved there",
                 srq.app_srq->handle, path_name(path), failure);
    return false;
  }
  srq.may_hold_stale[path] = false;
  VF_LOG_INFO("srq {:#x}: swept {} receive(s) left on the {} SRQ by an earlier move",
              srq.app_srq->handle, swept, path_name(path));
  return true;
}

bool srq_member_in_use(const Protection& q) {
  return !q.destroyed && !q.qp->application_failed.load() && q.qp->mode() != PostMode::kBypass;
}

// A QP of a moving SRQ that cannot move with it: its receives leave, so it fails as it would
// have without the shim (its old QP to ERR, its held errors to the application).
void give_up_member(Protection& q, const char* why) {
  VirtualQp& v = *q.qp;
  to_error(v.path[v.active_path()].qp, v.active_path() == kPrimary);
  release_held_errors(q);
  v.lock().lock();
  v.set_mode(PostMode::kBypass);
  v.lock().unlock();
  set_unprotected(q, fmt::format("its shared receive queue moved without it ({})", why));
}

void answer_failover(Protection& p, std::uint64_t delivered);

// A member whose pairing is in flight and whose own path still works: the SRQ's move waits for it.
bool srq_member_still_pairing(const Protection& q) {
  const VirtualQp& v = *q.qp;
  return !q.paired && (q.pairing || q.start_pairing_pending) && !v.path[v.active_path()].failed &&
         !v.link_error_seen.load();
}

// Switches every QP of an SRQ to `target` and moves the SRQ's unconsumed receives there.
// `passive`: the member whose peer asked for the switch (it answers with the peer's epoch); the
// passives of a move that waited (SrqGroup::pending) are remembered too.
void switch_srq_group(SrqGroup& g, int target, FailoverReason reason, Protection* passive,
                      std::uint32_t passive_epoch, std::uint64_t passive_delivered) {
  Engine& e = engine();
  VirtualSrq& srq = *g.srq;
  std::vector<SrqGroup::PassiveMember> passives = std::move(g.pending.passives);
  g.pending.passives.clear();
  if (passive != nullptr) {
    auto known = std::find_if(passives.begin(), passives.end(),
                              [&](const auto& m) { return m.q == passive; });
    if (known == passives.end()) known = passives.insert(passives.end(), {passive});
    known->epoch = passive_epoch;
    known->delivered = passive_delivered;
  }
  auto passive_of = [&](const Protection* q) -> const SrqGroup::PassiveMember* {
    for (const auto& m : passives) {
      if (m.q == q) return &m;
    }
    return nullptr;
  };
  std::vector<Protection*> movers, blocked, waiting;
  for (VirtualQp* member : g.members) {
    auto it = e.protections.find(member);
    if (it == e.protections.end()) continue;
    Protection& q = it->second;
    if (passive_of(&q) != nullptr && srq_member_in_use(q) && !q.sw.in_progress) {
      movers.push_back(&q);
      continue;
    }
    if (!srq_member_in_use(q) || q.sw.in_progress || q.qp->active_path() == target) continue;
    if (can_switch_to(q, target)) {
      movers.push_back(&q);
    } else if (reason != FailoverReason::kFailback && srq_member_still_pairing(q)) {
      waiting.push_back(&q);
    } else {
      blocked.push_back(&q);
    }
  }
  if (movers.empty()) {
    g.pending = {};
    return;
  }
  if (reason == FailoverReason::kFailback && !blocked.empty()) {
    VF_LOG_DEBUG("srq {:#x}: failback waits for {} more QP(s) to be re-connected",
                 srq.app_srq->handle, blocked.size());
    return;
  }
  if (!waiting.empty()) {
    const std::uint64_t now = monotonic_ns();
    if (!g.pending.active) {
      g.pending.active = true;
      g.pending.since_ns = now;
      VF_LOG_INFO("srq {:#x}: its move to the {} path waits for the pairing of {} QP(s) on it "
                  "(qp {}{}), at most {} ms",
                  srq.app_srq->handle, path_name(target), waiting.size(), waiting[0]->qp->vqpn,
                  waiting.size() > 1 ? ", ..." : "", kSrqPairingWaitNs / 1'000'000);
    }
    g.pending.target = target;
    g.pending.reason = reason;
    if (now - g.pending.since_ns < kSrqPairingWaitNs) {
      g.pending.passives = std::move(passives);
      return;
    }
    for (Protection* q : waiting) blocked.push_back(q);  // waited long enough
  }
  g.pending = {};
  const int from = srq.active_path();
  if (from != target && srq.may_hold_stale[target] && !sweep_srq(g, target)) {
    if (reason == FailoverReason::kFailback) return;
    for (Protection* q : movers) give_up_member(*q, "the other path's SRQ could not be swept");
    return;
  }
  srq.set_holding(true);
  for (Protection* q : blocked) give_up_member(*q, "no usable standby path of its own");
  for (Protection* q : movers) {
    if (const SrqGroup::PassiveMember* m = passive_of(q)) {
      begin_switch(*q, target, reason == FailoverReason::kFailback ? reason
                                                                  : FailoverReason::kPeerRequest,
                   m->epoch, false);
    } else {
      // Moved along with the QP whose peer asked: for its own peer, a request of ours.
      const bool along = !passives.empty() && reason != FailoverReason::kFailback;
      begin_switch(*q, target, along ? FailoverReason::kPeerRequest : reason, q->epoch + 1, true);
    }
  }
  // Every QP of the SRQ is off the old path and its completions are in: what the record still
  // holds was consumed by nobody.
  const int moved = srq.move_to(target);
  if (from != target) srq.may_hold_stale[from] = true;
  if (moved < 0) {
    VF_LOG_ERROR("srq {:#x}: not every receive could be posted on the {} SRQ", srq.app_srq->handle,
                 path_name(target));
  } else {
    VF_LOG_INFO("srq {:#x}: {} receive(s) moved {} -> {} with {} QP(s)", srq.app_srq->handle,
                moved, path_name(from), path_name(target), movers.size());
  }
  for (Protection* q : movers) {
    if (const SrqGroup::PassiveMember* m = passive_of(q)) {
      answer_failover(*q, m->delivered);
      continue;
    }
    FailoverRequest request;
    request.local = q->local;
    request.remote = q->remote;
    request.delivered_messages = q->sw.local_count;
    request.reason = static_cast<std::uint32_t>(reason);
    request.epoch = q->sw.epoch;
    request.target_path = static_cast<std::uint8_t>(target);
    if (!send_to_peer(*q, request)) {
      abort_switch(*q, "the peer's shim cannot be reached");
    } else if (q->sw.peer_known) {
      finish_switch(*q);
    }
  }
}

void start_switch(Protection& p, int target, FailoverReason reason) {
  VirtualQp& v = *p.qp;
  if (p.sw.in_progress || v.active_path() == target) return;
  if (!can_switch_to(p, target)) {
    if (v.link_error_seen.load() || reason == FailoverReason::kErrorCompletion) {
      release_held_errors(p);
    }
    if (reason != FailoverReason::kFailback) {
      set_unprotected(p, fmt::format("its {} path failed and the {} path is not usable; the "
                                     "application sees the failure",
                                     path_name(v.active_path()), path_name(target)));
    }
    return;
  }
  if (SrqGroup* group = group_of(v)) return switch_srq_group(*group, target, reason, nullptr, 0, 0);
  begin_switch(p, target, reason, p.epoch + 1, true);
  FailoverRequest request;
  request.local = p.local;
  request.remote = p.remote;
  request.delivered_messages = p.sw.local_count;
  request.reason = static_cast<std::uint32_t>(reason);
  request.epoch = p.sw.epoch;
  request.target_path = static_cast<std::uint8_t>(target);
  if (!send_to_peer(p, request)) return abort_switch(p, "the peer's shim cannot be reached");
  if (p.sw.peer_known) finish_switch(p);
}

bool hold_down_if_silent(Protection& p, int path, std::uint64_t now, bool seen_by_peer);

void handle_failover(const QpKey& ours, std::uint64_t delivered, std::uint32_t epoch,
                     std::uint8_t target, bool is_request, FailoverReason reason) {
  Protection* p = protection_by_key(ours);
  if (p == nullptr) return;
  SwitchState& sw = p->sw;
  if (is_request && reason == FailoverReason::kPortDown) {
    // The peer's port went down: what this side saw fail on the path (its requests' retries
    // running out, its own port ACTIVE) is explained, and a hold it took for a silent failure
    // would outlast the port's return. Requests may cross: this side may have switched first.
    const int path = sw.in_progress ? sw.from : other_path(p->qp->active_path());
    if (p->hold[path].until_ns != 0) {
      VF_LOG_INFO("qp {}: the peer's port went down: its {} path is no longer held down", p->qp->vqpn,
                  path_name(path));
      p->hold[path] = HoldDown{};
    }
  }
  if (sw.in_progress && sw.epoch == epoch) {
    sw.peer_known = true;
    sw.peer_count = delivered;
    if (sw.local_ready) finish_switch(*p);
    return;
  }
  if (!is_request || sw.in_progress || epoch <= p->epoch) {
    VF_LOG_DEBUG("qp {}: stale failover message (epoch {}, ours {})", p->qp->vqpn, epoch,
                 p->epoch);
    return;
  }
  if (p->qp->active_path() == target) return;
  if (p->qp->application_failed.load() || p->qp->mode() == PostMode::kBypass) {
    VF_LOG_INFO("qp {}: the peer asks for a switch, but the application has taken the QP down",
                p->qp->vqpn);
    return;
  }
  // The peer switches: so do we, whatever our ports say (its side of the path failed). If it saw
  // the path fail silently, this end holds it down too: the two ends then hold and lengthen their
  // holds together, whichever of them sees the next silent failure first.
  if (reason == FailoverReason::kErrorCompletion) {
    hold_down_if_silent(*p, p->qp->active_path(), monotonic_ns(), true);
  }
  if (SrqGroup* group = group_of(*p->qp)) {
    return switch_srq_group(*group, target, reason, p, epoch, delivered);
  }
  begin_switch(*p, target, reason == FailoverReason::kFailback ? reason
                                                                : FailoverReason::kPeerRequest,
               epoch, false);
  answer_failover(*p, delivered);
}

// The passive side, its half begun: the peer's count is known, ours goes back, replay.
void answer_failover(Protection& p, std::uint64_t delivered) {
  SwitchState& sw = p.sw;
  sw.peer_known = true;
  sw.peer_count = delivered;
  FailoverReply reply;
  reply.local = p.local;
  reply.remote = p.remote;
  reply.delivered_messages = sw.local_count;
  reply.epoch = sw.epoch;
  reply.target_path = static_cast<std::uint8_t>(sw.to);
  send_to_peer(p, reply);
  finish_switch(p);
}

// ------------------------------------------------------------------ re-arming a path

void send_rearm(Protection& p, int path, bool is_reply, std::uint32_t nonce) {
  VirtualQp& v = *p.qp;
  vf::Rearm message;
  message.nonce = nonce;
  message.local = p.local;
  message.remote = p.remote;
  message.path = static_cast<std::uint8_t>(path);
  message.qpn = v.path[path].qp->qp_num;
  message.gid = v.path[path].gid;
  message.psn = v.path[path].psn;
  message.is_reply = is_reply;
  send_to_peer(p, message);
}

bool port_active(int device, std::uint8_t port) {
  return engine().devices[device].ports[port].state == IBV_PORT_ACTIVE;
}

// The active path failed with error completions (seen here, or by the peer, which asks for the
// switch): if its port is ACTIVE nothing local explains it, and it is held down before its re-arm
// (HoldDown).
bool hold_down_if_silent(Protection& p, int path, std::uint64_t now, bool seen_by_peer) {
  const PhysicalPath& physical = p.qp->path[path];
  // Asked of the device, not the cached state: a port going down fails the requests before its
  // event is read, and a hold for a port that is down would outlast the port's return.
  ibv_port_attr attr{};
  const bool active =
      ibv_query_port(engine().devices[physical.device_index].context, physical.port, &attr) == 0
          ? attr.state == IBV_PORT_ACTIVE
          : port_active(physical.device_index, physical.port);
  if (!active) return false;
  HoldDown& hold = p.hold[path];
  const bool soon_after_rearm =
      hold.restored_ns != 0 && now - hold.restored_ns < kStableAfterRearmNs && hold.period_ns != 0;
  hold.period_ns = soon_after_rearm ? std::min(hold.period_ns * 2, kMaxHoldDownNs)
                                    : engine().first_hold_down_ns;
  hold.until_ns = now + hold.period_ns;
  VF_LOG_INFO("qp {}: its {} path failed with its port ACTIVE (a silent failure beyond the port, "
              "seen by {}); it is not re-armed for {:.1f} s{}",
              p.qp->vqpn, path_name(path), seen_by_peer ? "the peer" : "this side",
              static_cast<double>(hold.period_ns) / 1e9,
              soon_after_rearm ? " (it failed again soon after its last re-arm)" : "");
  // One path left for the hold (its re-arm says "protected again").
  set_unprotected(p, fmt::format("its {} path failed silently and is held down for {:.1f} s; "
                                 "running on the {} path alone",
                                 path_name(path), static_cast<double>(hold.period_ns) / 1e9,
                                 path_name(other_path(path))));
  return true;
}

bool held_down(const Protection& p, int path, std::uint64_t now) {
  return p.hold[path].until_ns != 0 && now < p.hold[path].until_ns;
}

bool connect_path(Protection& p, int path, std::uint32_t qpn, const Gid& gid, std::uint32_t psn) {
  return path == kPrimary ? connect_primary(p, qpn, psn) : connect_standby(p, qpn, gid, psn, p.peer_mtu);
}

// may_fail_back: only the side that asked for the re-arm (it connects last, when the reply
// arrives) starts the failback; the answering side's QP may still be reaching RTR otherwise.
void path_restored(Protection& p, int path, bool may_fail_back) {
  VirtualQp& v = *p.qp;
  p.hold[path].restored_ns = monotonic_ns();
  p.hold[path].until_ns = 0;
  v.path[path].connected = true;
  v.path[path].failed = false;
  // Done; the numbering of requests goes on (a later re-arm must not look older).
  p.rearm[path] = Rearm{.nonce = p.rearm[path].nonce,
                        .answered_nonce = p.rearm[path].answered_nonce,
                        .seen_nonce = p.rearm[path].seen_nonce};
  if (!p.unprotected_reason.empty() && p.paired) {
    VF_LOG_INFO("qp {}: protected again — the {} path is re-connected", v.vqpn, path_name(path));
    p.unprotected_reason.clear();
  }
  if (may_fail_back && path == kPrimary && v.active_path() == kStandby && engine().config.failback &&
      !p.sw.in_progress) {
    start_switch(p, kPrimary, FailoverReason::kFailback);
  }
}

// One end of a pair asks for re-arming and the other answers, never both (two crossed requests
// would each reset the QP the other just connected): the asker is the smaller process token,
// or within one process the smaller QP key.
bool answers_rearm(const Protection& p) {
  if (!p.peer.local) return engine().token > p.peer.token;
  if (p.local.qpn != p.remote.qpn) return p.local.qpn > p.remote.qpn;
  return p.local.gid > p.remote.gid;
}

void handle_rearm(const vf::Rearm& message) {
  Protection* p = protection_by_key(message.remote);
  if (p == nullptr || message.path > 1) return;
  VirtualQp& v = *p->qp;
  const int path = message.path;
  PhysicalPath& physical = v.path[path];
  if (message.is_reply) {
    if (!p->rearm[path].awaiting || message.nonce != p->rearm[path].nonce) {
      VF_LOG_DEBUG("qp {}: stale re-arm reply for the {} path ignored", v.vqpn, path_name(path));
      return;
    }
    if (connect_path(*p, path, message.qpn, message.gid, message.psn)) {
      path_restored(*p, path, true);
    } else {
      p->rearm[path].awaiting = false;
    }
    return;
  }
  // A request: ours too if our port is up and the path is idle.
  p->rearm[path].seen_nonce = std::max(p->rearm[path].seen_nonce, message.nonce);
  if (v.active_path() == path || p->sw.in_progress) return;
  if (!port_active(physical.device_index, physical.port)) return;
  if (held_down(*p, path, monotonic_ns())) return;  // the asker asks again after its retry
  if (message.nonce <= p->rearm[path].answered_nonce) return;  // an older request, overtaken
  p->rearm[path].awaiting = false;
  physical.psn = random_psn();
  physical.connected = false;  // in RESET/INIT until connected again: no switch may go there
  if (!reset_path(*p, path) ||
      !connect_path(*p, path, message.qpn, message.gid, message.psn)) {
    VF_LOG_WARN("qp {}: re-connecting the {} path failed", v.vqpn, path_name(path));
    return;
  }
  p->rearm[path].answered_nonce = message.nonce;
  send_rearm(*p, path, true, message.nonce);
  path_restored(*p, path, false);
}

void send_path_status(Protection& p, int path, bool up);

void maybe_rearm(Protection& p, int path) {
  VirtualQp& v = *p.qp;
  Rearm& rearm = p.rearm[path];
  if (!rearm.needed || p.sw.in_progress || v.active_path() == path ||
      v.application_failed.load()) {
    return;
  }
  const PhysicalPath& physical = v.path[path];
  if (!port_active(physical.device_index, physical.port)) return;
  const std::uint64_t now = monotonic_ns();
  if (held_down(p, path, now)) return;  // neither asks nor says its port is back
  if (p.local != p.remote && answers_rearm(p)) {
    // The peer asks; it must hear that it can now (its requests while our port was down went
    // unanswered, and it may not even know the port was down). Repeated: a notice may be lost.
    if (rearm.notice_sent_ns == 0 || now >= rearm.notice_sent_ns + engine().rearm_retry_ns) {
      rearm.notice_sent_ns = now;
      send_path_status(p, path, true);
    }
    return;
  }
  if (rearm.awaiting && now < rearm.sent_ns + engine().rearm_retry_ns) return;
  v.path[path].psn = random_psn();
  v.path[path].connected = false;  // in RESET/INIT until connected again: no switch may go there
  if (!reset_path(p, path)) return;
  if (p.local == p.remote) {
    // A QP connected to itself (NCCL's flush QP): both ends are this QP.
    if (connect_path(p, path, v.path[path].qp->qp_num, v.path[path].gid, v.path[path].psn)) {
      path_restored(p, path, true);
    }
    return;
  }
  rearm.awaiting = true;
  rearm.sent_ns = now;
  send_rearm(p, path, false, ++rearm.nonce);
}

// A notice, not a step of a protocol that waits for it: sent only on a session that exists (or
// to this process), never by connecting while the engine's lock is held. A lost "up" is sent
// again by maybe_rearm; a lost "down" costs the peer's report, not its data.
void send_path_status(Protection& p, int path, bool up) {
  if (p.local == p.remote) return;  // a QP connected to itself: this side is the peer
  PathStatus status;
  status.local = p.local;
  status.remote = p.remote;
  status.path = static_cast<std::uint8_t>(path);
  status.up = up;
  // The asker's latest request; the answerer's latest request seen (PathStatus::rearm_nonce).
  status.rearm_nonce = answers_rearm(p) ? p.rearm[path].seen_nonce : p.rearm[path].nonce;
  if (!send_on_open_session(p, status)) {
    VF_LOG_DEBUG("qp {}: no session to the peer's shim; its {} path's {} notice is not sent",
                 p.qp->vqpn, path_name(path), up ? "up" : "down");
  }
}

// The peer's end of one of our idle paths lost its port, or has it again (PathStatus).
void handle_path_status(const PathStatus& message) {
  Protection* p = protection_by_key(message.remote);
  if (p == nullptr || message.path > 1 || !p->paired || p->destroyed) return;
  if (p->remote != message.local) return;  // from an earlier pair of a reused QP number
  VirtualQp& v = *p->qp;
  const int path = message.path;
  // A path that carries traffic (or is being switched to or from) is the handshake's business.
  if (v.active_path() == path || p->sw.in_progress || v.application_failed.load()) return;
  Rearm& rearm = p->rearm[path];
  const bool we_ask = !answers_rearm(*p);
  if (!message.up) {
    if (!we_ask) {
      // Sent before a re-arm the peer asked for and we answered since: the path is fine.
      if (message.rearm_nonce < rearm.answered_nonce) {
        VF_LOG_DEBUG("qp {}: stale notice of the peer's {} path ignored", v.vqpn, path_name(path));
        return;
      }
      // Its requests up to here were sent before its port went: none may connect us now.
      rearm.answered_nonce = message.rearm_nonce;
    }
    v.path[path].failed = true;
    rearm.needed = true;
    const PhysicalPath& ours = v.path[path];
    if (port_active(ours.device_index, ours.port)) {  // else our own reason says more
      set_unprotected(*p, fmt::format("the peer's end of its {} path lost its port; running on "
                                      "the {} path alone",
                                      path_name(path), path_name(v.active_path())));
    }
    return;
  }
  if (!we_ask) return;  // the peer asks itself
  // A request the peer has not seen yet will be answered: asking again would drop it.
  if (rearm.awaiting && rearm.nonce > message.rearm_nonce) return;
  rearm.needed = true;
  rearm.awaiting = false;  // ask now: a request sent while the peer's port was down went unanswered
  maybe_rearm(*p, path);
}

// ------------------------------------------------------------------ events

void on_port_change(int device, std::uint8_t port, ibv_port_state state) {
  Engine& e = engine();
  PortInfoState& info = e.devices[device].ports[port];
  if (info.state == state) return;
  const ibv_port_state before = info.state;
  info.state = state;
  ++info.changes;
  VF_LOG_INFO("failover: port {}/{} is {} (was {})", e.devices[device].name, port,
              port_state_name(state), port_state_name(before));
  const bool down = state != IBV_PORT_ACTIVE;
  if (down) {  // every path on the port first: an SRQ's move must see all its members' paths dead
    for (auto& [key, p] : e.protections) {
      for (int path = 0; path < kPathCount; ++path) {
        PhysicalPath& physical = p.qp->path[path];
        if (!p.destroyed && physical.device_index == device && physical.port == port) {
          physical.failed = true;
        }
      }
    }
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    VirtualQp& v = *p.qp;
    for (int path = 0; path < kPathCount; ++path) {
      if (v.path[path].device_index != device || v.path[path].port != port) continue;
      // An idle path: the failover handshake will not tell the peer about it, this side must.
      const bool idle = v.active_path() != path && !p.sw.in_progress;
      if (down) {
        if (v.active_path() == path && !p.sw.in_progress) {
          start_switch(p, other_path(path), FailoverReason::kPortDown);
        }
        // Whether it just moved (alone, or with its SRQ) or had moved before: one path left.
        if (p.paired && v.active_path() != path) {
          set_unprotected(p, fmt::format("its {} path's port {}/{} is down; running on the {} "
                                         "path alone",
                                         path_name(path), e.devices[device].name, port,
                                         path_name(v.active_path())));
        }
        if (p.paired && v.active_path() != path) {
          // A reply to a request sent before the loss would connect a QP whose port is down.
          p.rearm[path].awaiting = false;
          p.rearm[path].needed = true;
          p.rearm[path].notice_sent_ns = 0;  // the "up" notice goes as soon as the port is back
        }
        if (p.paired && idle) send_path_status(p, path, false);
      } else if (p.paired && v.active_path() != path) {
        p.hold[path] = HoldDown{};  // a port event: whatever failed may have been repaired
        if (!p.rearm[path].needed && v.path[path].connected) {
          // The port blinked while the path idled: its QP may be in error; re-arm it anyway.
          p.rearm[path].needed = true;
        }
        maybe_rearm(p, path);  // the asker asks; the answerer says its port is back
      }
    }
  }
}

void on_device_event(int device) {
  Engine& e = engine();
  ibv_async_event event{};
  if (e.verbs.get_async_event(e.devices[device].context, &event) != 0) return;
  switch (event.event_type) {
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE: {
      const int port = event.element.port_num;
      if (port >= 1 && port <= e.devices[device].port_count) {
        ibv_port_attr attr{};
        ibv_port_state state = event.event_type == IBV_EVENT_PORT_ERR ? IBV_PORT_DOWN
                                                                      : IBV_PORT_ACTIVE;
        if (ibv_query_port(e.devices[device].context, static_cast<std::uint8_t>(port), &attr) == 0) {
          state = attr.state;
        }
        on_port_change(device, static_cast<std::uint8_t>(port), state);
      }
      break;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      // A standby QP of ours failed: that path needs re-arming before it can carry traffic.
      for (auto& [key, p] : e.protections) {
        if (p.destroyed) continue;
        if (p.qp->path[kStandby].qp == event.element.qp) {
          p.qp->path[kStandby].failed = true;
          if (p.qp->active_path() == kStandby) start_switch(p, kPrimary, FailoverReason::kErrorCompletion);
        }
      }
      break;
    default:
      break;
  }
  e.verbs.ack_async_event(&event);
}

void process_message(const PeerRef& from, std::uint64_t session, ControlMessage& message) {
  if (auto* m = std::get_if<PairRequest>(&message)) return handle_pair_request(from, session, *m);
  if (auto* m = std::get_if<PairReply>(&message)) return handle_pair_reply(from, session, *m);
  if (auto* m = std::get_if<PairRefused>(&message)) return handle_pair_refused(*m);
  if (auto* m = std::get_if<MrUpdate>(&message)) {
    if (!from.local) learn_translations(peer_index(from.token, m->device_gid), m->registrations);
    return;
  }
  if (auto* m = std::get_if<MrQuery>(&message)) {
    Engine& e = engine();
    MrUpdate update;
    update.device_gid = m->device_gid;
    for (const auto& [mr, record] : e.mrs) {
      if (mr->rkey == m->primary_rkey && record->shadow != nullptr &&
          gid_of_port(record->device, 1, m->device_gid)) {
        update.registrations.push_back({reinterpret_cast<std::uintptr_t>(mr->addr), mr->length,
                                        mr->rkey, record->shadow->rkey});
      }
    }
    if (!from.local) e.channel.send(session, update);
    return;
  }
  if (auto* m = std::get_if<FailoverRequest>(&message)) {
    return handle_failover(m->remote, m->delivered_messages, m->epoch, m->target_path, true,
                           static_cast<FailoverReason>(m->reason));
  }
  if (auto* m = std::get_if<FailoverReply>(&message)) {
    return handle_failover(m->remote, m->delivered_messages, m->epoch, m->target_path, false,
                           FailoverReason::kPeerRequest);
  }
  if (auto* m = std::get_if<vf::Rearm>(&message)) return handle_rearm(*m);
  if (auto* m = std::get_if<PathStatus>(&message)) return handle_path_status(*m);
}

// Connections opened to a peer's first-contact address (a rail) are doubled by one to the first
// address it advertises (management first), so the channel outlives the rail.
void on_hello(ControlSession& session) {
  Engine& e = engine();
  if (!session.outgoing || session.peer.addresses.empty()) return;
  const std::uint32_t best = session.peer.addresses.front();
  if (best == session.remote_address) return;
  if (e.channel.find_by_endpoint(best, session.peer.port) != nullptr) return;
  std::string error;
  const std::uint16_t port = session.peer.port;
  if (e.channel.connect_async(best, port, kConnectTimeoutMs, error) == 0) {
    VF_LOG_DEBUG("control: no second session to {}:{} ({})", ipv4_text(best), port, error);
  }
}

// A switch whose new path has reported nothing for kResumeLateNs while work was outstanding:
// what both ends of the path look like, once. Not an error by itself (the peer may simply have
// nothing to send), but a request the new path never completes waits silently when its device
// retries for ever (rnr_retry 7; rxe also takes retry_cnt 7 as "for ever"), and the two ends'
// lines side by side tell a receive missing at the responder (RNR) from a PSN the ends disagree
// on.
void report_late_resume(Protection& p) {
  Engine& e = engine();
  VirtualQp& v = *p.qp;
  const int active = v.active_path();
  ibv_qp* qp = v.path[active].qp;
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  std::string physical = "not queried";
  if (qp != nullptr && e.verbs.query_qp != nullptr &&
      e.verbs.query_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN | IBV_QP_DEST_QPN,
                       &init) == 0) {
    physical = fmt::format("state {}, sq_psn {:#x}, rq_psn {:#x}, dest qp {}",
                           qp_state_name(attr.qp_state), attr.sq_psn, attr.rq_psn,
                           attr.dest_qp_num);
  }
  v.lock().lock();
  const std::uint32_t sends = v.send_ring().outstanding();
  const std::uint64_t next_sequence = v.send_ring().next_sequence();
  const std::uint64_t next_to_post = v.next_send_to_post();
  const std::uint64_t messages = v.send_ring().messages_posted();
  const std::uint32_t receives = v.recv_ring().pending();
  const std::uint64_t delivered = v.recv_ring().delivered_messages();
  v.lock().unlock();
  VF_LOG_INFO("qp {}: no completion on the {} path {:.1f} s after the switch: {} request(s) "
              "outstanding (next to post {}, next sequence {}, {} message(s) posted), {} "
              "receive(s) pending ({} message(s) delivered); {} qp {}: {}",
              v.vqpn, path_name(active),
              static_cast<double>(monotonic_ns() - p.switched_monotonic_ns) / 1e9, sends,
              next_to_post, next_sequence, messages, receives, delivered, path_name(active),
              qp != nullptr ? qp->qp_num : 0, physical);
}

void periodic_work() {
  Engine& e = engine();
  const std::uint64_t now = monotonic_ns();
  for (auto& [app_srq, g] : e.srqs) {
    if (g.pending.active) switch_srq_group(g, g.pending.target, g.pending.reason, nullptr, 0, 0);
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    VirtualQp& v = *p.qp;
    if (v.link_error_seen.load(std::memory_order_relaxed) && !p.sw.in_progress) {
      // The peer is told "error completion" only for a silent failure (it then holds the path
      // down too); errors of a port that is down are that port's failure.
      const bool silent = hold_down_if_silent(p, v.active_path(), now, false);
      v.path[v.active_path()].failed = true;
      start_switch(p, other_path(v.active_path()),
                   silent ? FailoverReason::kErrorCompletion : FailoverReason::kPortDown);
      v.link_error_seen.store(false);
    }
    if (p.start_pairing_pending) {
      p.start_pairing_pending = false;
      if (!p.paired && !p.pairing) start_pairing(p);
    }
    if (p.sw.in_progress && !p.sw.peer_known && now > p.sw.started_monotonic_ns &&
        now - p.sw.started_monotonic_ns > kSwitchAnswerTimeoutNs) {
      abort_switch(p, "no answer from the peer's shim within 10 s");
    }
    if (p.pairing && p.awaiting_session != 0 && now > p.awaiting_since_ns &&
        now - p.awaiting_since_ns > kPairingAnswerTimeoutNs) {
      p.awaiting_session = 0;
      try_next_candidate(p);
    }
    if (p.pairing && p.awaiting_session == 0 && p.retry_at_ns != 0 && now >= p.retry_at_ns) {
      p.retry_at_ns = 0;
      try_next_candidate(p);
    }
    if (v.translation_missing.exchange(false)) {
      // Ask the peer for what we miss, then try again (the answer arrives as an MrUpdate).
      std::uint32_t missing = 0;
      bool found = false;
      v.lock().lock();
      v.send_ring().for_each_from(v.next_send_to_post(), [&](const SendRecord& record) {
        std::uint32_t ignored = 0;
        const std::uint32_t rkey = record.wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
                                           record.wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD
                                       ? record.wr.wr.atomic.rkey
                                       : record.wr.wr.rdma.rkey;
        found = !translate_rkey(v.peer, rkey, &ignored);
        missing = rkey;
        return false;
      });
      v.lock().unlock();
      if (found && !p.peer.local) send_to_peer(p, MrQuery{missing, p.remote.gid});
    }
    if (!v.holding() && v.mode() == PostMode::kRouted) {
      v.lock().lock();
      v.post_pending();
      v.lock().unlock();
    }
    for (int path = 0; path < kPathCount; ++path) maybe_rearm(p, path);
    if (p.pending_event != UINT32_MAX && !p.resume_late_reported && !p.sw.in_progress &&
        now > p.switched_monotonic_ns && now - p.switched_monotonic_ns > engine().resume_late_ns &&
        v.awaiting_resume.load()) {
      p.resume_late_reported = true;
      report_late_resume(p);
    }
    if (p.pending_event != UINT32_MAX) {
      const std::uint64_t resumed = v.counters.resumed_unix_ns.load();
      if (resumed != 0 && !v.awaiting_resume.load()) {
        SwitchEvent& event = p.events[p.pending_event];
        event.resumed_unix_ns = resumed;
        VF_LOG_INFO("qp {}: traffic resumed on the {} path {:.3f} ms after the {} was detected",
                    v.vqpn, event.to,
                    static_cast<double>(resumed - event.detected_unix_ns) / 1e6, event.reason);
        p.pending_event = UINT32_MAX;
        v.counters.resumed_unix_ns.store(0);
      }
    }
  }
}

bool has_pending_work() {
  Engine& e = engine();
  for (const auto& [app_srq, g] : e.srqs) {
    if (g.pending.active) return true;
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    if (p.pairing || p.start_pairing_pending || p.pending_event != UINT32_MAX || p.rearm[0].needed || p.rearm[1].needed ||
        p.sw.in_progress || p.qp->translation_missing.load()) {
      return true;
    }
  }
  return false;
}

void handle_shadow_channel(ChannelState& channel) {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  Engine& e = engine();
  if (e.verbs.get_cq_event(channel.shadow_channel, &cq, &context) != 0) return;
  e.verbs.ack_cq_events(cq, 1);
  for (CqState* state : channel.cqs) {
    if (state->shadow == cq) {
      // One event per arming, as on the application's CQ: its ibv_req_notify_cq re-arms both.
      state->shadow_events_pending.fetch_add(1);
    }
  }
  eventfd_write(channel.wake_fd, 1);
}

void run_engine() {
  // It takes many locks in a row during a switch: it must never become their biased owner.
  SpinLock::never_bias_this_thread();
  Engine& e = engine();
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    std::size_t device_first = 0, channel_first = 0, comp_first = 0;
    std::vector<ChannelState*> comp_channels;
    {
      std::lock_guard lock(e.mutex);
      fds.push_back({e.wake_fd, POLLIN, 0});
      device_first = fds.size();
      for (int i = 0; i < e.device_count; ++i) fds.push_back({e.devices[i].context->async_fd, POLLIN, 0});
      comp_first = fds.size();
      for (auto& [ptr, channel] : e.channels) {
        if (channel.shadow_channel == nullptr) continue;
        fds.push_back({channel.shadow_channel->fd, POLLIN, 0});
        comp_channels.push_back(&channel);
      }
      channel_first = fds.size();
      e.channel.collect(fds);
    }
    int timeout_ms = -1;
    {
      std::lock_guard lock(e.mutex);
      if (has_pending_work() || !e.local_inbox.empty() || !e.outbox.empty()) timeout_ms = 20;
      if (e.config.stats_interval_s > 0) {
        const std::uint64_t now = monotonic_ns();
        const int until_stats = e.next_stats_ns > now
                                    ? static_cast<int>((e.next_stats_ns - now) / 1000000) + 1
                                    : 0;
        timeout_ms = timeout_ms < 0 ? until_stats : std::min(timeout_ms, until_stats);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      VF_LOG_ERROR("failover: the engine's poll failed ({}); failover is off", strerror(errno));
      return;
    }
    bool write_stats_now = false;
    {
      std::lock_guard lock(e.mutex);
      if (fds[0].revents & POLLIN) {
        eventfd_t ignored = 0;
        eventfd_read(e.wake_fd, &ignored);
      }
      for (std::size_t k = device_first; k < comp_first; ++k) {
        if (fds[k].revents & POLLIN) on_device_event(static_cast<int>(k - device_first));
      }
      for (std::size_t k = comp_first; k < channel_first; ++k) {
        if (fds[k].revents & POLLIN) handle_shadow_channel(*comp_channels[k - comp_first]);
      }
      e.channel.handle(
          fds, channel_first,
          [&](ControlSession& session, ControlMessage& message) {
            if (std::holds_alternative<Hello>(message)) return on_hello(session);
            PeerRef from;
            from.token = session.peer.process_token;
            from.addresses = session.peer.addresses;
            from.port = session.peer.port;
            from.pid = session.peer.pid;
            from.session = session.id;
            process_message(from, session.id, message);
          },
          [&](const ControlSession& closed) {
            VF_LOG_DEBUG("control: session with {}:{} closed", ipv4_text(closed.remote_address),
                         closed.remote_port);
            for (auto& [key, p] : e.protections) {
              if (p.destroyed) continue;
              if (p.pairing && p.awaiting_session == closed.id) {
                p.awaiting_session = 0;
                try_next_candidate(p);
              }
            }
          });
      while (!e.local_inbox.empty()) {
        auto inbox = std::move(e.local_inbox);
        e.local_inbox.clear();
        PeerRef self;
        self.local = true;
        for (auto& [ignored, message] : inbox) process_message(self, 0, message);
      }
      flush_outbox();
      periodic_work();
      if (e.config.stats_interval_s > 0 && monotonic_ns() >= e.next_stats_ns) {
        e.next_stats_ns = monotonic_ns() + static_cast<std::uint64_t>(e.config.stats_interval_s * 1e9);
        write_stats_now = true;
      }
    }
    if (write_stats_now) FailoverEngine::instance().write_stats("interval");
  }
}

void write_stats_at_exit() { FailoverEngine::instance().write_stats("exit"); }

bool start_engine() {
  Engine& e = engine();
  if (e.started) return true;
  if (e.start_failed) return false;
  e.started = true;
  discover_devices();
  e.token = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
            static_cast<std::uint64_t>(::getpid());
  e.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::string error;
  if (!e.channel.listen(e.config.ctrl_port_first, e.config.ctrl_port_last, error)) {
    VF_LOG_WARN("failover: control channel unavailable ({}); QPs of peers that contact us cannot "
                "pair",
                error);
  }
  std::vector<std::uint32_t> rails;
  for (int i = 0; i < e.device_count; ++i) {
    for (std::uint8_t port = 1; port <= e.devices[i].port_count; ++port) {
      Gid gid{};
      standby_gid_index(i, port, &gid);
      if (const std::uint32_t address = ipv4_of_gid(gid)) rails.push_back(address);
    }
  }
  Hello hello;
  hello.process_token = e.token;
  hello.pid = static_cast<std::uint32_t>(::getpid());
  hello.port = e.channel.port();
  hello.addresses = local_ipv4_addresses(rails);
  if (hello.addresses.size() > kMaxAddresses) hello.addresses.resize(kMaxAddresses);
  e.channel.set_hello(hello);
  DatapathServices services;
  services.translate_lkey = translate_lkey;
  services.translate_rkey = translate_rkey;
  services.wake_engine = wake_engine;
  set_datapath_services(services);
  if (e.config.stats_interval_s > 0) {
    e.next_stats_ns = monotonic_ns() + static_cast<std::uint64_t>(e.config.stats_interval_s * 1e9);
  }
  try {
    std::thread(run_engine).detach();
  } catch (const std::system_error& failure) {
    VF_LOG_WARN("failover: cannot start the engine thread ({}); running unprotected",
                failure.what());
    e.start_failed = true;
    return false;
  }
  if (!e.config.stats_file.empty()) atexit(write_stats_at_exit);
  // Probed here, off the data path (the first claim would otherwise pay the syscalls).
  const bool biased_locks = SpinLock::bias_available();
  VF_LOG_DEBUG("failover: engine started, control port {}; data-path locks {}", e.channel.port(),
               biased_locks ? "biased to their thread (membarrier)" : "without bias (no membarrier)");
  return true;
}

ShadowPd* shadow_pd_for(ibv_pd* app_pd, int backup_device) {
  Engine& e = engine();
  auto key = std::make_pair(app_pd, backup_device);
  auto it = e.shadow_pds.find(key);
  if (it != e.shadow_pds.end()) return &it->second;
  ibv_pd* shadow = e.verbs.alloc_pd(e.devices[backup_device].context);
  if (shadow == nullptr) return nullptr;
  return &(e.shadow_pds[key] = ShadowPd{shadow, backup_device});
}

bool mirror_mr(MrRecord& record, ibv_pd* app_pd, void* addr, std::size_t length,
               std::uint64_t iova, unsigned int access, int dmabuf_fd,
               std::uint64_t dmabuf_offset) {
  Engine& e = engine();
  const int backup = e.devices[record.device].ports[1].backup_device;
  if (backup < 0) return false;
  ShadowPd* pd = shadow_pd_for(app_pd, backup);
  if (pd == nullptr) return false;
  if (dmabuf_fd >= 0) {
    record.shadow = e.verbs.reg_dmabuf_mr != nullptr
                        ? e.verbs.reg_dmabuf_mr(pd->shadow, dmabuf_offset, length, iova,
                                                dmabuf_fd, static_cast<int>(access))
                        : nullptr;
  } else {
    record.shadow = e.verbs.reg_mr_iova2(pd->shadow, addr, length, iova, access);
  }
  if (record.shadow == nullptr) {
    VF_LOG_WARN("failover: mirroring a registration of {} bytes on {} failed ({}); QPs using it "
                "cannot be replayed there",
                length, e.devices[backup].name, strerror(errno));
    return false;
  }
  return true;
}

// One MrUpdate per (peer process, device) paired with a QP of this device.
void queue_mr_update(int device, const MrTranslation& translation) {
  Engine& e = engine();
  std::vector<std::pair<std::uint64_t, Gid>> told;
  for (auto& [key, p] : e.protections) {
    if (p.destroyed || !p.paired || p.peer.local) continue;
    if (p.qp->path[kPrimary].device_index != device) continue;
    const auto who = std::make_pair(p.peer.token, p.local.gid);
    if (std::find(told.begin(), told.end(), who) != told.end()) continue;
    told.push_back(who);
    MrUpdate update;
    update.registrations.push_back(translation);
    update.device_gid = p.local.gid;
    e.outbox.emplace_back(p.qp.get(), update);
  }
}

// A mirrored registration's translations: this process's own tables, and its peers (those
// pairing later get the table in the pairing), from the engine's thread.
void publish_mirror(const MrRecord& record) {
  const ibv_mr* mr = record.app_mr;
  put_key(lkeys(), lkey_key(record.device, mr->lkey), record.shadow->lkey);
  // For QPs of this process connected to this device.
  put_key(rkeys(), rkey_key(local_peer_index(record.device), mr->rkey), record.shadow->rkey);
  queue_mr_update(record.device, MrTranslation{reinterpret_cast<std::uintptr_t>(mr->addr),
                                               mr->length, mr->rkey, record.shadow->rkey});
  wake_engine();
}

// The reverse, for the keys the registration had: translations withdrawn, the shadow gone.
void forget_mirror(MrRecord& record, std::uint32_t lkey, std::uint32_t rkey) {
  erase_key(lkeys(), lkey_key(record.device, lkey));
  queue_mr_update(record.device, MrTranslation{0, 0, rkey, 0});
  erase_key(rkeys(), rkey_key(local_peer_index(record.device), rkey));
  wake_engine();
  if (record.shadow != nullptr) engine().verbs.dereg_mr(record.shadow);
  record.shadow = nullptr;
}

void flush_outbox() {
  Engine& e = engine();
  auto outbox = std::move(e.outbox);
  e.outbox.clear();
  for (auto& [v, message] : outbox) {
    auto it = e.protections.find(v);
    if (it == e.protections.end() || it->second.destroyed) continue;
    send_to_peer(it->second, message);
  }
}

}  // namespace

// ==================================================================== public interface

FailoverEngine& FailoverEngine::instance() {
  static FailoverEngine engine_interface;
  return engine_interface;
}

void FailoverEngine::configure(const Config& config, const VerbsApi& verbs, std::string program) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.config = config;
  e.verbs = verbs;
  e.program = std::move(program);
  e.configured = true;
}

bool FailoverEngine::running() const { return engine().started && !engine().start_failed; }

void FailoverEngine::on_device_opened(ibv_context* /*context*/) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!e.configured) return;
  start_engine();
}

// The same lookups the data-path hooks make (core/datapath_registries.h).
VirtualQp* FailoverEngine::virtual_qp(const ibv_qp* qp) const { return find_virtual_qp(qp); }
CqState* FailoverEngine::cq_state(const ibv_cq* cq) const { return find_cq_state(cq); }

void FailoverEngine::on_cq_created(ibv_cq* cq, ibv_comp_channel* channel) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!running() || cq == nullptr) return;
  const int device = device_of_context(cq->context);
  if (device < 0) return;
  const ibv_context_ops* ops = e.verbs.provider_ops(cq->context);
  auto state = std::make_unique<CqState>(cq, device, ops,
                                         static_cast<std::uint32_t>(2 * cq->cqe + 64));
  state->app_channel = channel;
  if (!cqs_by_address().insert(cq, state.get())) return;
  e.cqs[cq] = std::move(state);
}

void FailoverEngine::on_cq_destroy(ibv_cq* cq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.cqs.find(cq);
  if (it == e.cqs.end()) return;
  CqState* state = it->second.get();
  for (auto& [key, p] : e.protections) {
    // A QP still uses it: the provider refuses the destroy (EBUSY) and the CQ lives on.
    if (!p.destroyed && (p.qp->send_cq == state || p.qp->recv_cq == state)) return;
  }
  cqs_by_address().erase(cq);
  state->lock.lock();  // no poller is inside any more
  state->lock.unlock();
  if (state->shadow != nullptr) e.verbs.destroy_cq(state->shadow);
  for (auto& [ptr, channel] : e.channels) {
    std::erase(channel.cqs, state);
  }
  // The record itself stays: a thread that read the registry just before the erase may still
  // hold it (CQ destruction is rare; the few bytes are not worth a use-after-free).
  it->second.release();
  e.cqs.erase(it);
}

void FailoverEngine::on_cq_resized(ibv_cq* cq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.cqs.find(cq);
  if (it == e.cqs.end()) return;
  CqState& state = *it->second;
  // The shadow must hold as many completions as the application's CQ now does, and the stash
  // twice as many (what a switch drains into it).
  if (state.shadow != nullptr && e.verbs.resize_cq != nullptr &&
      e.verbs.resize_cq(state.shadow, cq->cqe) != 0) {
    VF_LOG_WARN("cq {}: resizing its shadow to {} failed; a switch may overflow it",
                static_cast<const void*>(cq), cq->cqe);
  }
  state.lock.lock();
  state.stash.grow(static_cast<std::uint32_t>(2 * cq->cqe + 64));
  state.lock.unlock();
}

void FailoverEngine::on_pd_destroy(ibv_pd* pd) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  for (auto it = e.shadow_pds.begin(); it != e.shadow_pds.end();) {
    if (it->first.first == pd) {
      e.verbs.dealloc_pd(it->second.shadow);
      it = e.shadow_pds.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// The shadow CQ of an application CQ on the backup device (with a shadow completion channel
// when the application's CQ has one).
bool ensure_shadow(CqState& state, int backup_device) {
  Engine& e = engine();
  if (state.shadow != nullptr) return state.shadow_device_index == backup_device;
  ibv_comp_channel* shadow_channel = nullptr;
  if (state.app_channel != nullptr) {
    ChannelState& channel = e.channels[state.app_channel];
    if (channel.app_channel == nullptr) {
      channel.app_channel = state.app_channel;
      channel.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    }
    if (channel.shadow_channel == nullptr) {
      channel.shadow_channel = e.verbs.create_comp_channel(e.devices[backup_device].context);
      if (channel.shadow_channel == nullptr) return false;
      wake_engine();
    }
    shadow_channel = channel.shadow_channel;
    channel.cqs.push_back(&state);
    state.wake_fd = channel.wake_fd;
  }
  state.shadow = e.verbs.create_cq(e.devices[backup_device].context, state.app_cq->cqe, nullptr,
                                   shadow_channel, 0);
  if (state.shadow == nullptr) return false;
  state.shadow_device_index = backup_device;
  state.shadow_channel = shadow_channel;
  if (shadow_channel != nullptr) ibv_req_notify_cq(state.shadow, 0);
  return true;
}

// The shadow of a shared receive queue on the backup device (same depth and SGEs).
bool ensure_shadow_srq(SrqGroup& g, int backup_device) {
  Engine& e = engine();
  VirtualSrq& srq = *g.srq;
  if (srq.shadow != nullptr) return srq.shadow_device_index == backup_device;
  ShadowPd* pd = shadow_pd_for(g.pd, backup_device);
  if (pd == nullptr) return false;
  ibv_srq_init_attr init{};
  init.attr.max_wr = srq.max_wr;
  init.attr.max_sge = srq.max_sge;
  ibv_srq* shadow = e.verbs.create_srq(pd->shadow, &init);
  if (shadow == nullptr) {
    VF_LOG_WARN("srq {:#x}: creating its shadow on {} failed ({})", srq.app_srq->handle,
                e.devices[backup_device].name, strerror(errno));
    return false;
  }
  srq.shadow = shadow;
  srq.shadow_device_index = backup_device;
  return true;
}

// A QP the shim cannot protect takes receives from this SRQ: its record would miss what that QP
// consumes, so the SRQ runs pass-through from now on, and so do its QPs.
void pin_srq_group(SrqGroup& g, const std::string& why) {
  if (!g.pinned_reason.empty()) return;
  Engine& e = engine();
  if (g.srq->active_path() != kPrimary) {
    VF_LOG_ERROR("srq {:#x}: {} while its receives are on the standby SRQ; that QP gets none "
                 "until they move back",
                 g.srq->app_srq->handle, why);
    return;
  }
  g.pinned_reason = why;
  g.srq->pin_to_primary();
  g.pending = {};  // a move that waited for this pairing will not happen
  VF_LOG_WARN("srq {:#x}: unprotected from now on — {}", g.srq->app_srq->handle, why);
  for (VirtualQp* member : g.members) {
    auto it = e.protections.find(member);
    if (it == e.protections.end() || it->second.destroyed) continue;
    // A member whose path already failed (its move waited) gets the errors it would have got.
    if (!it->second.sw.in_progress &&
        (member->path[kPrimary].failed || member->link_error_seen.load())) {
      release_held_errors(it->second);
    }
    member->lock().lock();
    if (!it->second.sw.in_progress) member->set_mode(PostMode::kBypass);
    member->lock().unlock();
    it->second.pairing = false;
    it->second.paired = false;
    set_unprotected(it->second, fmt::format("its shared receive queue is unprotected ({})", why));
  }
}

}  // namespace

void FailoverEngine::on_srq_created(ibv_srq* srq, ibv_pd* pd) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!running() || srq == nullptr || e.srqs.count(srq) != 0) return;
  const int device = device_of_context(srq->context);
  if (device < 0 || e.devices[device].ports[1].backup_device < 0) {
    VF_LOG_INFO("srq {:#x}: not protected — its device has no backup", srq->handle);
    return;
  }
  ibv_srq_attr attr{};
  if (e.verbs.query_srq(srq, &attr) != 0) {
    VF_LOG_WARN("srq {:#x}: not protected — ibv_query_srq failed", srq->handle);
    return;
  }
  if (attr.max_sge > VirtualSrq::kMaxSge) {
    VF_LOG_WARN("srq {:#x}: not protected — {} SGEs per receive (the shim keeps up to {})",
                srq->handle, attr.max_sge, VirtualSrq::kMaxSge);
    return;
  }
  SrqGroup& g = e.srqs[srq];
  g.pd = pd;
  g.srq = std::make_unique<VirtualSrq>(srq, e.verbs.provider_ops(srq->context), attr.max_wr,
                                       attr.max_sge, device);
  srqs_by_address().insert(srq, g.srq.get());
}

void FailoverEngine::on_srq_modified(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.srqs.find(srq);
  if (it == e.srqs.end() || it->second.srq->shadow == nullptr || !(mask & IBV_SRQ_MAX_WR)) return;
  // The shadow must hold as many receives as the application's.
  ibv_srq_attr resize{};
  resize.max_wr = attr->max_wr;
  if (e.verbs.modify_srq(it->second.srq->shadow, &resize, IBV_SRQ_MAX_WR) != 0) {
    VF_LOG_WARN("srq {:#x}: resizing its shadow to {} failed", srq->handle, attr->max_wr);
  }
}

void FailoverEngine::on_srq_destroyed(ibv_srq* srq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.srqs.find(srq);
  if (it == e.srqs.end()) return;
  srqs_by_address().erase(srq);
  if (it->second.srq->shadow != nullptr) e.verbs.destroy_srq(it->second.srq->shadow);
  // A poster that found the record before the erase is done with it once it lets go of it.
  it->second.srq->lock().lock();
  it->second.srq->lock().unlock();
  e.srqs.erase(it);
}

VirtualSrq* FailoverEngine::virtual_srq(const ibv_srq* srq) const {
  return srqs_by_address().find(srq);
}

void FailoverEngine::on_qp_created(ibv_qp* qp, const ibv_qp_init_attr_ex& attr) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!running() || qp == nullptr) return;
  SrqGroup* group = nullptr;
  if (attr.srq != nullptr) {
    auto it = e.srqs.find(attr.srq);
    if (it != e.srqs.end()) group = &it->second;
  }
  auto pass_through = [&](std::string reason, bool info) {
    if (group != nullptr) pin_srq_group(*group, fmt::format("qp {} on it {}", qp->qp_num, reason));
    if (info) {
      VF_LOG_INFO("qp {}: not protected — {}", qp->qp_num, reason);
    } else {
      VF_LOG_WARN("qp {}: unprotected — {}", qp->qp_num, reason);
    }
    e.unprotected.emplace_back(qp->qp_num, std::move(reason));
  };
  if (attr.qp_type != IBV_QPT_RC) {
    return pass_through(fmt::format("type {} passes through (only RC QPs are protected)",
                                    static_cast<int>(attr.qp_type)),
                        true);
  }
  if (attr.srq != nullptr && group == nullptr) {
    return pass_through("its shared receive queue is not protected (see the SRQ's log line)", false);
  }
  if (group != nullptr && !group->pinned_reason.empty()) {
    return pass_through(fmt::format("its shared receive queue is not protected: {}",
                                    group->pinned_reason),
                        false);
  }
  const int device = device_of_context(qp->context);
  if (device < 0) return pass_through("its device is unknown to the engine", false);
  const Device& d = e.devices[device];
  const int backup = d.ports[1].backup_device;
  if (backup < 0) return pass_through(fmt::format("{} has no backup device", d.name), false);
  auto send_it = e.cqs.find(attr.send_cq);
  auto recv_it = e.cqs.find(attr.recv_cq);
  if (send_it == e.cqs.end() || recv_it == e.cqs.end()) {
    return pass_through("its CQ was created before the shim's engine started", false);
  }
  CqState* send_cq = send_it->second.get();
  CqState* recv_cq = recv_it->second.get();
  if (!ensure_shadow(*send_cq, backup) || !ensure_shadow(*recv_cq, backup)) {
    return pass_through("no shadow CQ on the backup device", false);
  }
  ShadowPd* pd = shadow_pd_for(attr.pd, backup);
  if (pd == nullptr) return pass_through("no shadow PD on the backup device", false);
  // The provider may have raised the capabilities: the ring must hold what the QP can.
  ibv_qp_init_attr actual{};
  ibv_qp_attr ignored{};
  ibv_qp_cap cap = attr.cap;
  if (e.verbs.query_qp(qp, &ignored, IBV_QP_CAP, &actual) == 0) cap = actual.cap;
  ibv_qp_init_attr standby_attr{};
  standby_attr.send_cq = send_cq->shadow;
  standby_attr.recv_cq = recv_cq->shadow;
  standby_attr.qp_type = IBV_QPT_RC;
  standby_attr.sq_sig_all = attr.sq_sig_all;
  standby_attr.cap = cap;
  if (group != nullptr) {
    if (!ensure_shadow_srq(*group, backup)) {
      return pass_through("no shadow of its shared receive queue on the backup device", false);
    }
    standby_attr.srq = group->srq->shadow;
    standby_attr.cap.max_recv_wr = 0;
    standby_attr.cap.max_recv_sge = 0;
  }
  ibv_qp* standby = e.verbs.create_qp(pd->shadow, &standby_attr);
  if (standby == nullptr) {
    return pass_through(fmt::format("creating its standby QP on {} failed ({})",
                                    e.devices[backup].name, strerror(errno)),
                        false);
  }
  auto virtual_qp = std::make_unique<VirtualQp>(qp, e.verbs.provider_ops(qp->context), cap,
                                                attr.sq_sig_all != 0, send_cq, recv_cq);
  VirtualQp* v = virtual_qp.get();
  v->path[kPrimary].qp = qp;
  v->path[kPrimary].device_index = device;
  v->path[kPrimary].port = 1;
  v->path[kStandby].qp = standby;
  v->path[kStandby].device_index = backup;
  v->path[kStandby].port = d.ports[1].backup_port;
  v->path[kStandby].gid_index = standby_gid_index(backup, v->path[kStandby].port, &v->path[kStandby].gid);
  v->path[kStandby].psn = random_psn();
  if (!to_reset_and_init(standby, v->path[kStandby].port, kFullAccess, false)) {
    e.verbs.destroy_qp(standby);
    return pass_through("its standby QP does not reach INIT", false);
  }
  if (group != nullptr) {
    v->srq = group->srq.get();
    group->members.push_back(v);
  }
  Protection& p = e.protections[v];
  p.qp = std::move(virtual_qp);
  p.app_pd = attr.pd;
  p.unprotected_reason = "not paired yet (the application has not connected it)";
  qps_by_qpn().insert(qpn_registry_key(device, qp->qp_num), v);
  qps_by_qpn().insert(qpn_registry_key(backup, standby->qp_num), v);
  qps_by_address().insert(qp, v);
  VF_LOG_DEBUG("qp {}: standby qp {} created on {}/{}", qp->qp_num, standby->qp_num,
               e.devices[backup].name, v->path[kStandby].port);
}

int FailoverEngine::modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask,
                              int (*real)(ibv_qp*, ibv_qp_attr*, int)) {
  VirtualQp* v = virtual_qp(qp);
  if (v == nullptr || attr == nullptr) return real(qp, attr, mask);
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.protections.find(v);
  if (it == e.protections.end()) return real(qp, attr, mask);
  Protection& p = it->second;
  ibv_qp_attr adjusted = *attr;
  if ((mask & IBV_QP_TIMEOUT) && (adjusted.timeout == 0 || adjusted.timeout > e.config.qp_timeout)) {
    VF_LOG_DEBUG("qp {}: transport timeout {} -> {} (VERBS_FAILOVER_QP_TIMEOUT)", qp->qp_num,
                 adjusted.timeout, e.config.qp_timeout);
    adjusted.timeout = e.config.qp_timeout;
  }
  if ((mask & IBV_QP_RETRY_CNT) && adjusted.retry_cnt > kMaxRetryCount) {
    VF_LOG_DEBUG("qp {}: retry count {} -> {} (a provider may take 7 as without end)", qp->qp_num,
                 adjusted.retry_cnt, kMaxRetryCount);
    adjusted.retry_cnt = kMaxRetryCount;
  }
  if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && !v->application_failed.load() &&
      (p.sw.in_progress || v->active_path() != kPrimary)) {
    // The peer switched the pair between the application's RTR and its RTS: the QP it drives
    // is in ERR under the engine's hands and its traffic runs on the standby. Its RTS is what a
    // re-arm will reconnect it with; for the application it succeeds, as it would have.
    VF_LOG_DEBUG("qp {}: RTS recorded (its traffic is on the {} path)", qp->qp_num,
                 path_name(v->active_path()));
    p.attrs.rts = adjusted;
    p.attrs.rts_mask = mask & ~IBV_QP_STATE;
    p.attrs.have_rts = true;
    if (mask & IBV_QP_SQ_PSN) v->path[kPrimary].psn = attr->sq_psn;
    qp->state = IBV_QPS_RTS;
    return 0;
  }
  const int result = real(qp, &adjusted, mask);
  if (result != 0 || !(mask & IBV_QP_STATE)) return result;
  switch (attr->qp_state) {
    case IBV_QPS_INIT:
      p.attrs.init = adjusted;
      p.attrs.init_mask = mask & ~IBV_QP_STATE;
      p.attrs.have_init = true;
      if (mask & IBV_QP_PORT) v->path[kPrimary].port = attr->port_num;
      break;
    case IBV_QPS_RTR: {
      p.attrs.rtr = adjusted;
      p.attrs.rtr_mask = mask & ~IBV_QP_STATE;
      p.attrs.have_rtr = true;
      ibv_gid gid{};
      const int gid_index = (mask & IBV_QP_AV) && attr->ah_attr.is_global ? attr->ah_attr.grh.sgid_index : 0;
      if (e.verbs.query_gid(e.devices[v->path[kPrimary].device_index].context,
                            v->path[kPrimary].port, gid_index, &gid) == 0) {
        v->path[kPrimary].gid = gid_of(gid);
        v->path[kPrimary].gid_index = gid_index;
      }
      p.local = QpKey{qp->qp_num, v->path[kPrimary].gid};
      if (mask & IBV_QP_DEST_QPN) {
        p.remote = QpKey{attr->dest_qp_num, (mask & IBV_QP_AV) && attr->ah_attr.is_global
                                                ? gid_of(attr->ah_attr.grh.dgid)
                                                : Gid{}};
        p.remote_known = true;
      }
      if (mask & IBV_QP_RQ_PSN) {
        // nothing: the application's PSNs stay its own until a re-arm picks fresh ones
      }
      // A peer in this process pairs at once (no network); any other pairing connects to the
      // peer, which may block: the engine's thread does it.
      if (!p.paired && !p.pairing && p.remote_known && !pair_locally(p)) {
        p.start_pairing_pending = true;
      }
      wake_engine();
      break;
    }
    case IBV_QPS_RTS:
      p.attrs.rts = adjusted;
      p.attrs.rts_mask = mask & ~IBV_QP_STATE;
      p.attrs.have_rts = true;
      if (mask & IBV_QP_SQ_PSN) v->path[kPrimary].psn = attr->sq_psn;
      break;
    case IBV_QPS_ERR:
    case IBV_QPS_RESET:
    case IBV_QPS_SQD:
    case IBV_QPS_SQE:
      // The application tears the QP down (or drives it itself): it gets what it asks for. If
      // its traffic runs on the standby, that QP goes to ERR as well, and its flushes reach the
      // application (translated) as the primary's would have.
      v->application_failed.store(true);
      if (v->active_path() == kStandby && v->path[kStandby].qp != nullptr) {
        to_error(v->path[kStandby].qp, false);
      } else if (!p.sw.in_progress) {
        v->lock().lock();
        v->set_mode(PostMode::kBypass);
        v->lock().unlock();
      }
      p.pairing = false;
      p.start_pairing_pending = false;
      p.rearm[0] = {};
      p.rearm[1] = {};
      break;
    default:
      break;
  }
  return result;
}

void FailoverEngine::on_qp_queried(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  VirtualQp* v = virtual_qp(qp);
  if (v == nullptr || attr == nullptr || v->application_failed.load()) return;
  (void)mask;
  if (qp->state == IBV_QPS_RTS) {
    attr->qp_state = IBV_QPS_RTS;
    attr->cur_qp_state = IBV_QPS_RTS;
  }
}

void FailoverEngine::on_qp_destroy(ibv_qp* qp) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  VirtualQp* v = virtual_qp(qp);
  if (v == nullptr) return;
  auto it = e.protections.find(v);
  if (it == e.protections.end()) return;
  if (SrqGroup* group = group_of(*v)) std::erase(group->members, v);
  qps_by_address().erase(qp);
  qps_by_qpn().erase(qpn_registry_key(v->path[kPrimary].device_index, qp->qp_num));
  if (v->path[kStandby].qp != nullptr) {
    qps_by_qpn().erase(qpn_registry_key(v->path[kStandby].device_index, v->path[kStandby].qp->qp_num));
  }
  // A poller that found the record before the erase is done with it once it lets go of the CQ.
  v->send_cq->lock.lock();
  v->send_cq->lock.unlock();
  v->recv_cq->lock.lock();
  v->recv_cq->lock.unlock();
  if (v->path[kStandby].qp != nullptr) e.verbs.destroy_qp(v->path[kStandby].qp);
  physical_states().erase(qp);
  // Keep the stats of a QP that existed (the file reports every QP of the run).
  Protection& p = it->second;
  p.destroyed = true;
  p.qp->path[kStandby].qp = nullptr;
  p.pairing = false;
  p.sw.in_progress = false;
  p.rearm[0] = {};
  p.rearm[1] = {};
  p.local = QpKey{};  // no longer matches a peer's message
}

void FailoverEngine::on_mr_registered(ibv_mr* mr, void* addr, std::size_t length,
                                      std::uint64_t iova, unsigned int access, int dmabuf_fd,
                                      std::uint64_t dmabuf_offset) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!running() || mr == nullptr) return;
  const int device = device_of_context(mr->context);
  if (device < 0 || e.devices[device].ports[1].backup_device < 0) return;
  auto record = std::make_unique<MrRecord>();
  record->app_mr = mr;
  record->device = device;
  record->iova = iova;
  record->access = access;
  record->dmabuf_fd = dmabuf_fd;
  record->dmabuf_offset = dmabuf_offset;
  if (!mirror_mr(*record, mr->pd, addr, length, iova, access, dmabuf_fd, dmabuf_offset)) return;
  publish_mirror(*record);
  e.mrs[mr] = std::move(record);
}

void FailoverEngine::on_mr_reregistered(ibv_mr* mr, int flags, std::uint32_t old_lkey,
                                        std::uint32_t old_rkey, int access) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.mrs.find(mr);
  if (it == e.mrs.end()) return;
  MrRecord& record = *it->second;
  // The old keys and the old mirror go (as for a deregistration)...
  forget_mirror(record, old_lkey, old_rkey);
  // ...and the registration as it is now is mirrored again: the provider updated the MR's
  // pd/addr/length; a new translation has no iova of its own (it is the address).
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) record.access = static_cast<unsigned int>(access);
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    record.iova = reinterpret_cast<std::uintptr_t>(mr->addr);
    if (record.dmabuf_fd >= 0) {
      VF_LOG_WARN("failover: a dma-buf registration moved (ibv_rereg_mr); it is no longer "
                  "mirrored, requests using it cannot be replayed on the standby");
      e.mrs.erase(it);
      return;
    }
  }
  if (!mirror_mr(record, mr->pd, mr->addr, mr->length, record.iova, record.access,
                 record.dmabuf_fd, record.dmabuf_offset)) {
    e.mrs.erase(it);
    return;
  }
  publish_mirror(record);
}

void FailoverEngine::on_mr_deregister(ibv_mr* mr) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.mrs.find(mr);
  if (it == e.mrs.end()) return;
  forget_mirror(*it->second, mr->lkey, mr->rkey);
  e.mrs.erase(it);
}

bool FailoverEngine::hide_async_event(ibv_context* context, const ibv_async_event& event) {
  Engine& e = engine();
  if (!running()) return false;
  std::lock_guard lock(e.mutex);
  const int device = device_of_context(context);
  if (device < 0) return false;
  switch (event.event_type) {
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE: {
      const int port = event.element.port_num;
      if (port < 1 || port > e.devices[device].port_count) return false;
      PortInfoState& info = e.devices[device].ports[port];
      if (info.backup_device < 0) return false;
      info.hidden_async_events.fetch_add(1);
      VF_LOG_INFO("failover: hid {} of {}/{} from the application", e.verbs.event_type_str(event.event_type),
                  e.devices[device].name, port);
      return true;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR: {
      VirtualQp* v = virtual_qp(event.element.qp);
      if (v == nullptr) return false;
      auto it = e.protections.find(v);
      if (it == e.protections.end()) return false;
      Protection& p = it->second;
      if (event.event_type == IBV_EVENT_COMM_EST) return false;
      if (v->application_failed.load()) return false;
      const bool switching_or_moved = p.sw.in_progress || v->active_path() != kPrimary;
      const bool can_move = can_switch_to(p, kStandby);
      if (!switching_or_moved && !can_move) return false;
      v->counters.hidden_async_events.fetch_add(1);
      if (!switching_or_moved) v->link_error_seen.store(true);
      wake_engine();
      return true;
    }
    case IBV_EVENT_QP_LAST_WQE_REACHED: {
      // An SRQ's QP reports it when it enters ERR: the shim's doing during a switch.
      VirtualQp* v = virtual_qp(event.element.qp);
      if (v == nullptr || v->srq == nullptr || v->application_failed.load()) return false;
      v->counters.hidden_async_events.fetch_add(1);
      return true;
    }
    case IBV_EVENT_CQ_ERR: {
      // An overrun caused by the flush of a switched QP is the shim's doing, not the app's.
      return false;
    }
    default:
      return false;
  }
}

int FailoverEngine::get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  Engine& e = engine();
  int wake_fd = -1;
  std::vector<CqState*> cqs;
  {
    std::lock_guard lock(e.mutex);
    auto it = e.channels.find(channel);
    if (it == e.channels.end() || it->second.shadow_channel == nullptr) return -2;
    wake_fd = it->second.wake_fd;
    cqs = it->second.cqs;
  }
  for (;;) {
    for (CqState* state : cqs) {
      std::uint32_t pending = state->shadow_events_pending.load();
      while (pending > 0 &&
             !state->shadow_events_pending.compare_exchange_weak(pending, pending - 1)) {
      }
      if (pending > 0) {
        state->shadow_events_unacked.fetch_add(1);
        *cq = state->app_cq;
        *cq_context = state->app_cq->cq_context;
        return 0;
      }
    }
    pollfd fds[2] = {{channel->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const bool blocking = !(fcntl(channel->fd, F_GETFL) & O_NONBLOCK);
    const int ready = ::poll(fds, 2, blocking ? -1 : 0);
    if (ready < 0 && errno == EINTR) continue;
    if (fds[1].revents & POLLIN) {
      eventfd_t ignored = 0;
      eventfd_read(wake_fd, &ignored);
      continue;
    }
    if (fds[0].revents & POLLIN || !blocking) return -2;  // the real event (or EAGAIN) is next
  }
}

unsigned int FailoverEngine::ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  CqState* state = cq_state(cq);
  if (state == nullptr) return nevents;
  std::uint32_t unacked = state->shadow_events_unacked.load();
  for (;;) {
    const std::uint32_t take = std::min<std::uint32_t>(unacked, nevents);
    if (state->shadow_events_unacked.compare_exchange_weak(unacked, unacked - take)) {
      return nevents - take;
    }
  }
}

void FailoverEngine::on_req_notify(ibv_cq* cq, int solicited_only) {
  CqState* state = cq_state(cq);
  if (state == nullptr) return;
  state->notify_armed.store(true);
  if (state->shadow == nullptr || state->shadow_channel == nullptr) return;
  ibv_req_notify_cq(state->shadow, solicited_only);
}

void FailoverEngine::write_stats(const char* reason) {
  Engine& e = engine();
  if (e.config.stats_file.empty()) return;
  StatsSnapshot snapshot;
  {
    std::lock_guard lock(e.mutex);
    snapshot.pid = static_cast<int>(::getpid());
    snapshot.program = e.program;
    snapshot.reason = reason;
    snapshot.written_unix_ms = realtime_ns() / 1000000;
    for (int i = 0; i < e.device_count; ++i) {
      const Device& d = e.devices[i];
      for (std::uint8_t port = 1; port <= d.port_count; ++port) {
        DeviceStats stats;
        stats.name = d.name;
        stats.port = port;
        stats.state = port_state_name(d.ports[port].state);
        if (d.ports[port].backup_device >= 0) {
          stats.backup = fmt::format("{}/{}", e.devices[d.ports[port].backup_device].name,
                                     d.ports[port].backup_port);
        }
        stats.port_changes = d.ports[port].changes;
        stats.hidden_async_events = d.ports[port].hidden_async_events.load();
        snapshot.devices.push_back(stats);
      }
    }
    for (auto& [key, p] : e.protections) {
      const VirtualQp& v = *p.qp;
      QpStats stats;
      stats.qpn = v.vqpn;
      stats.device = fmt::format("{}/{}", e.devices[v.path[kPrimary].device_index].name,
                                 v.path[kPrimary].port);
      stats.backup = fmt::format("{}/{}", e.devices[v.path[kStandby].device_index].name,
                                 v.path[kStandby].port);
      if (p.paired) {
        stats.peer = p.self_connected ? "self" : p.peer.local ? "this_process" : "other_process";
      }
      stats.is_protected = p.paired && p.unprotected_reason.empty();
      stats.path = p.sw.in_progress ? "switching" : path_name(v.active_path());
      stats.state = !p.paired                      ? (p.pairing ? "pairing" : "unpaired")
                    : p.sw.in_progress             ? "switching"
                    : !p.unprotected_reason.empty() ? "unprotected"
                                                    : (v.active_path() == kPrimary ? "primary"
                                                                                   : "standby");
      stats.unprotected_reason = p.unprotected_reason;
      stats.failovers = p.failovers;
      stats.failbacks = p.failbacks;
      stats.replayed_wrs = v.counters.replayed_wrs.load();
      stats.hidden_error_completions = v.counters.hidden_error_completions.load();
      stats.hidden_async_events = v.counters.hidden_async_events.load();
      stats.synthesized_completions = v.counters.synthesized_completions.load();
      stats.events = p.events;
      if (p.pending_event != UINT32_MAX && v.counters.resumed_unix_ns.load() != 0) {
        stats.events[p.pending_event].resumed_unix_ns = v.counters.resumed_unix_ns.load();
      }
      snapshot.qps.push_back(std::move(stats));
    }
    for (const auto& [qpn, why] : e.unprotected) {
      QpStats stats;
      stats.qpn = qpn;
      stats.is_protected = false;
      stats.path = "primary";
      stats.state = "unprotected";
      stats.unprotected_reason = why;
      snapshot.qps.push_back(std::move(stats));
    }
  }
  std::string error;
  if (!write_file_atomically(e.config.stats_file, render_stats_json(snapshot), error)) {
    VF_LOG_WARN("stats: {}", error);
  }
}

void FailoverEngine::set_first_hold_down(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.first_hold_down_ns = nanoseconds;
}

void FailoverEngine::set_resume_late(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.resume_late_ns = nanoseconds;
}

void FailoverEngine::set_rearm_retry(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.rearm_retry_ns = nanoseconds;
}

int FailoverEngine::protection_of(std::uint32_t qpn, std::string& reason) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  for (auto& [key, p] : e.protections) {
    if (p.destroyed || p.qp->vqpn != qpn) continue;
    reason = !p.paired ? "not paired" : p.unprotected_reason;
    return p.paired && p.unprotected_reason.empty() ? 1 : 0;
  }
  for (const auto& [unprotected_qpn, why] : e.unprotected) {
    if (unprotected_qpn != qpn) continue;
    reason = why;
    return 0;
  }
  return -1;
}

void FailoverEngine::lock_for_fork() { engine().mutex.lock(); }
void FailoverEngine::unlock_after_fork() { engine().mutex.unlock(); }

void FailoverEngine::forget_after_fork() {
  Engine& e = engine();
  // The child inherits the mutex state of the fork()ing thread only (pthread_atfork runs this
  // with it taken); the engine thread does not exist in the child.
  e.channel.abandon();
  e.started = false;
  e.start_failed = true;  // the child runs unprotected (documented)
  e.mutex.unlock();
}

}  // namespace vf
