// The engine's state of one protected QP (Protection) and of one shared receive queue with the
// protected QPs that take receives from it (SrqGroup): pairing, the switch in progress, re-arm
// and hold-down of each path, and the stats kept of it. Plain data: every room of
// core/failover/ reads and writes it with the engine's mutex held.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/control_message.h"
#include "core/failover/limits.h"
#include "core/stats.h"
#include "core/virtual_qp.h"
#include "core/virtual_srq.h"

namespace vf::failover {

// Where a message to the peer goes: a TCP session to another process, or this process itself
// (both ends of the pair here: a loopback or self-connected QP).
struct PeerRef {
  bool local = false;
  std::uint64_t token = 0;    // the peer process's token (its Hello)
  std::uint64_t session = 0;  // the session the pairing used
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
  std::uint64_t request_sent_ns = 0;  // initiator: when its FailoverRequest last went
  std::uint32_t resends = 0;
};

struct RearmState {
  bool needed = false;
  bool awaiting = false;
  std::uint64_t sent_ns = 0;
  std::uint32_t nonce = 0;  // of our latest request (asker)
  // Answerer: requests up to this one are done with (answered, or sent before the asker's port
  // went down: PathStatus).
  std::uint32_t answered_nonce = 0;
  std::uint32_t seen_nonce = 0;      // answerer: of the latest request that arrived at all
  std::uint64_t notice_sent_ns = 0;  // answerer: when it last said its port is back
  // Asker: no request before this (its own end could not be connected: its GID gone, or the
  // peer's answer refused), so a path that cannot come back is asked at the re-arm retry, not
  // at every engine pass; and whether the missing GID was logged.
  std::uint64_t not_before_ns = 0;
  bool gid_wait_logged = false;
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

// The active path failed and the other one is not usable yet (reset after a failback and not
// re-armed, its port down): the QP waits up to Engine::grace_ns for it, its posts held and its
// error completions hidden, then switches there, or the application sees the failure
// (path_wait.h).
struct PathWait {
  bool active = false;
  int target = kStandby;
  FailoverReason reason = FailoverReason::kPortDown;
  std::uint64_t since_ns = 0;
  std::uint64_t until_ns = 0;
  // The active path's port was down when the wait began: its return may let the QP go on there
  // (a blink RC's retries covered). A path that failed otherwise (errors, a fatal QP, a lost
  // shadow CQ) is never gone back to by the wait.
  bool active_port_down = false;
};

struct QpAttrs {  // what the application gave its QP, to re-connect the primary later
  bool have_init = false, have_rtr = false, have_rts = false;
  ibv_qp_attr init{}, rtr{}, rts{};
  int init_mask = 0, rtr_mask = 0, rts_mask = 0;
};

// The probe of the idle standby (path_probe.h).
struct ProbeState {
  std::uint64_t in_flight = 0;  // the wr_id of the probe awaiting its completion (0: none)
  std::uint64_t posted_ns = 0;
  // No probe before (the standby was just connected: the peer's end may not be yet).
  std::uint64_t quiet_until_ns = 0;
  std::uint64_t sent = 0;    // for the stats
  std::uint64_t failures = 0;
  bool disabled = false;  // no slot for it, or the standby refused one: no probes of this QP
  bool slot_reserved = false;  // the standby's extra send slot and shadow entry (qp_lifecycle)
};

// rdma_cm's disconnect told over the control channel (cm_disconnect.h).
struct CmDisconnectState {
  bool asked = false;      // this application called rdma_disconnect: the peer is told
  bool answered = false;   // its shim confirmed
  bool from_peer = false;  // the peer's application disconnected first (queued for the hooks)
  std::uint64_t until_ns = 0;
  std::uint64_t next_send_ns = 0;
  std::size_t sends = 0;  // rotates the routes of each resend
};

struct Protection {
  std::unique_ptr<VirtualQp> qp;
  bool destroyed = false;  // the application destroyed the QP; kept for the stats only
  ibv_pd* app_pd = nullptr;
  QpKey local;
  QpKey remote;
  bool remote_known = false;
  bool paired = false;
  // The pair is over for good: this end's QP failed for good (§5g) or the peer's did (it said so:
  // PairEnded). Nothing more is switched, re-armed or asked of the peer; the reason stays.
  bool ended = false;
  // The primary is back, but an atomic posted on the standby is not yet known done: the failback
  // waits (it would stop the standby under it, and an atomic cannot be replayed), and each pass
  // of the engine looks again (try_deferred_failback).
  bool failback_deferred = false;
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
  // The standby is connected but waits in RTR for the application's RTS, which says how many
  // RNR retries it wants (connect_standby, standby_follow_rts).
  bool standby_rts_pending = false;
  bool start_pairing_pending = false;
  bool peer_unreachable_reported = false;
  QpAttrs attrs;
  SwitchState sw;
  std::uint32_t epoch = 0;
  RearmState rearm[kPathCount];
  HoldDown hold[kPathCount];
  PathWait path_wait;
  std::uint64_t failovers = 0;
  std::uint64_t failbacks = 0;
  std::vector<SwitchEvent> events;
  std::uint32_t pending_event = UINT32_MAX;  // index of the event awaiting its resume time
  std::uint64_t switched_monotonic_ns = 0;   // when the latest switch finished
  bool resume_late_reported = false;         // the latest switch's "no completion yet" line
  CmDisconnectState cm;
  ProbeState probe;
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
    std::uint64_t asked_ns = 0;  // when its request came (a failback waits kSrqFailbackWaitNs)
  };
  struct PendingMove {
    bool active = false;
    int target = 0;
    FailoverReason reason = FailoverReason::kPortDown;
    std::uint64_t since_ns = 0;
    std::vector<PassiveMember> passives;
  } pending;
};

}  // namespace vf::failover
