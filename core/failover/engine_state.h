// The failover engine's shared state (docs/design.md §5): the devices and ports it watches, the
// mirrored registrations, the completion channels with shadows, and the Engine that holds them
// with every Protection and SrqGroup (protection.h). Each room of core/failover/ is a set of
// functions over an Engine&, called with Engine::mutex held unless its header says otherwise.
#pragma once

#include <infiniband/verbs.h>
#include <sys/eventfd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/control_channel.h"
#include "core/datapath_registries.h"
#include "core/failover/limits.h"
#include "core/failover/protection.h"
#include "core/verbs_api.h"

namespace vf::failover {

inline const char* path_name(int path) {
  return path == kPrimary ? "primary" : "standby";
}

inline const char* reason_name(FailoverReason reason) {
  switch (reason) {
    case FailoverReason::kPortDown:
      return "port_down";
    case FailoverReason::kErrorCompletion:
      return "error_completion";
    case FailoverReason::kPeerRequest:
      return "peer_request";
    case FailoverReason::kFailback:
      return "failback";
  }
  return "unknown";
}

struct PortInfoState {
  ibv_port_state state = IBV_PORT_NOP;
  int link_layer = 0;
  ibv_mtu active_mtu = IBV_MTU_1024;
  int backup_device = -1;
  std::uint8_t backup_port = 1;
  std::uint64_t changes = 0;
  // When it last became ACTIVE after being down (monotonic; 0: ACTIVE since the engine started).
  std::uint64_t active_since_ns = 0;
  // The "waits until stable" line is written once per return of the port.
  bool stability_wait_logged = false;
  std::atomic<std::uint64_t> hidden_async_events{0};
  // The standby GID chosen on this port (standby_gid_index; -1: not chosen yet, or forgotten at
  // the port's last event): a scan of the GID table per QP created would cost up to 256 queries.
  int standby_gid_index = -1;
  Gid standby_gid{};
  int standby_gid_type = -1;
};

struct Device {
  std::string name;
  ibv_device* device = nullptr;
  ibv_context* context = nullptr;  // the engine's own
  std::uint8_t port_count = 0;
  PortInfoState ports[kMaxPorts + 1];
  int max_qp_rd_atom = 1;
  // Whether the device flushes a receive posted to a QP in ERR (the drain marker, §5d): learnt
  // at the first switch. One that missed the deadline (rxe of older kernels, a dead device, or
  // an engine starved of the CPU) is drained without a marker until marker_retry_at_ns, a
  // back-off that doubles with each deadline missed in a row (kMarkerRetryFirstNs up to
  // kMarkerRetryMaxNs) and ends when a flush comes.
  enum class MarkerFlush { kUnknown, kYes, kNo } marker_flush = MarkerFlush::kUnknown;
  std::uint64_t marker_retry_at_ns = 0;
  std::uint64_t marker_backoff_ns = 0;
};

struct MrRecord {
  ibv_mr* app_mr = nullptr;
  int device = -1;  // the application's device
  ibv_mr* shadow = nullptr;
  // What it was registered with (ibv_rereg_mr changes some of it).
  std::uint64_t iova = 0;
  unsigned int access = 0;
  int dmabuf_fd = -1;
  std::uint64_t dmabuf_offset = 0;
};

struct ShadowPd {
  ibv_pd* shadow = nullptr;
  int device = -1;
};

// An application's completion channel (channel_wakeup.h). epoll_fd >= 0: the application's
// channel->fd is that epoll set, watching real_fd (the channel's event file) and wake_fd.
struct ChannelState {
  ibv_comp_channel* app_channel = nullptr;
  ibv_comp_channel* shadow_channel = nullptr;
  int wake_fd = -1;  // the engine writes it for each event of a shadow CQ (or of a stash)
  int epoll_fd = -1;
  int real_fd = -1;
  bool real_dead = false;     // the real event file failed (EIO): no longer watched
  std::vector<CqState*> cqs;  // those whose events come through wake_fd
};

// Called by the engine's thread, without the lock, for each QP whose peer disconnected it through
// rdma_cm (cm_disconnect.h); set by the shim's rdma_cm hooks.
using CmDisconnectHandler = void (*)(ibv_qp* qp, std::uint32_t qpn);

// Everything the engine knows, guarded by `mutex`. One per process in the shim
// (FailoverEngine::instance() owns it); a test may build its own and drive a room's functions
// with it. The data path never reads it: it finds its records in core/datapath_registries.h.
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
  // The application's QP: the physical state under the state libibverbs caches in qp->state
  // (qp_transitions.h, modify()).
  std::map<const ibv_qp*, ibv_qp_state> physical_states;
  std::map<std::pair<std::uint64_t, Gid>, std::uint32_t> peer_index_of;
  // The session the message being handled came on, while process_message runs (0 otherwise):
  // what its handler sends to that peer goes back on it, the one route just seen working. The
  // session the sender would pick (find_by_token: the management network first) may be dead
  // without a sign while another network carried the message (issue 20 item 7).
  std::uint64_t answering_session = 0;
  // Control messages the application's threads want sent: the engine's thread sends them (it
  // alone touches the network, which may block).
  std::vector<std::pair<VirtualQp*, ControlMessage>> outbox;
  std::map<ibv_cq*, std::unique_ptr<CqState>> cqs;
  std::map<ibv_srq*, SrqGroup> srqs;
  std::map<ibv_comp_channel*, ChannelState> channels;
  std::vector<std::pair<std::uint64_t, ControlMessage>> local_inbox;  // (unused token, message)
  std::uint64_t next_stats_ns = 0;
  // The stats file: what it said when last written (engine_stats.cc), and when a change may be
  // written next (changes are written at most every kStatsChangeGapNs).
  std::uint64_t stats_written_digest = 0;
  std::uint64_t next_change_stats_ns = 0;
  // Orders the writes of the stats file (the engine's thread, the exit handler on another): a
  // snapshot is taken and written whole before the next one is taken, so the file never goes
  // back to an older state; after the exit's write (stats_final) nothing is written. Taken before
  // `mutex`, never while holding it (write_stats, and the fork handlers in that order).
  std::mutex stats_file_mutex;
  bool stats_final = false;
  // Messages about a pair that did not come from its peer (message_dispatch.cc): dropped, and
  // logged at the 1st, 2nd, 4th, 8th... so that a flood costs a few lines.
  std::uint64_t foreign_messages = 0;
  std::uint64_t rearm_retry_ns = kRearmRetryNs;
  std::uint64_t resume_late_ns = kResumeLateNs;
  std::uint64_t first_hold_down_ns = kFirstHoldDownNs;
  std::uint64_t port_stable_ns = 0;  // Config::port_stable_ms, set at start
  std::uint64_t grace_ns = 0;        // Config::grace_ms, set at start (0: no wait for a path)
  std::uint64_t probe_interval_ns = 0;  // Config::probe_ms, set at start (0: no probes)
  std::uint64_t next_probe_round_ns = 0;  // path_probe.h
  std::uint64_t probe_serial = 0;  // numbers every probe of the process (wr_id's low bits)
  // rdma_cm disconnects (cm_disconnect.h): announcements not yet answered, the condition their
  // application threads wait on, and the peer's disconnects for the handler.
  std::vector<VirtualQp*> cm_pending;
  std::condition_variable cm_answered;
  struct CmDisconnectDue {
    ibv_qp* qp = nullptr;
    std::uint32_t qpn = 0;
    std::uint64_t due_ns = 0;  // after the grace in which the CM's own event may come
  };
  std::vector<CmDisconnectDue> cm_disconnects_due;
  CmDisconnectHandler cm_disconnect_handler = nullptr;
};

inline bool engine_running(const Engine& e) {
  return e.started && !e.start_failed;
}

// Something for the engine's thread to act on (a message in the local inbox, a QP to pair...).
inline void wake_engine(Engine& e) {
  const int fd = e.wake_fd;
  if (fd >= 0) eventfd_write(fd, 1);
}

}  // namespace vf::failover
