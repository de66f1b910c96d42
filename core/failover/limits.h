// The failover engine's limits and timings, in one place (docs/design.md §5): how many devices
// and ports it tracks, how long it waits for a peer, a flush or a pairing, and the hold-down's
// lengths. Each room of core/failover/ uses its own; the static_asserts tie those that depend on
// each other.
#pragma once

#include <cstdint>

namespace vf::failover {

constexpr std::uint8_t kMaxPorts = 4;
constexpr int kMaxDevices = 32;
constexpr int kConnectTimeoutMs = 300;
// Outgoing sessions send_on_every_route keeps to one peer's addresses (message_dispatch.h), the
// ones it starts included: enough for a management network and two rails, bounded against a
// peer that advertises many addresses or is gone.
constexpr int kMaxRouteConnectsPerSend = 4;
constexpr std::uint64_t kPairingAnswerTimeoutNs = 2'000'000'000;
// A re-arm request unanswered for this long is sent again (with a fresh PSN), and so is the
// answerer's notice that its port is back (PathStatus). Long enough that a late reply to the
// previous request is not mistaken for the answer to the new one. Tests may lengthen it
// (verbs_failover_debug_set_rearm_retry_ms) to prove that something does not wait for it.
constexpr std::uint64_t kRearmRetryNs = 5'000'000'000;
// GID table slots searched: a port's gid_tbl_len (rxe has 1024), at most this many, as an
// address vector's sgid_index is 8 bits. A NIC with RoCE v1 and v2 takes two slots per address,
// and VLAN or macvlan devices add theirs to the port's table: 16 fill quickly.
constexpr int kMaxGidScan = 256;
static_assert(kMaxGidScan <= 256, "ibv_global_route::sgid_index is a uint8_t");
constexpr int kPairingRounds = 6;
constexpr std::uint64_t kSwitchAnswerTimeoutNs = 10'000'000'000;
// A switch request unanswered for this long is sent again (same epoch, same count), until the
// answer comes or kSwitchAnswerTimeoutNs passes: a request or answer lost with a session that
// broke (the peer answers a repeated request it already answered with the same answer).
constexpr std::uint64_t kSwitchResendNs = 1'000'000'000;
// No repeat this close to the deadline: its answer (the peer drains first, up to
// kReceiveFlushWaitNs) could come after this side gave up, and the peer would have switched alone.
constexpr std::uint64_t kSwitchResendUntilNs = kSwitchAnswerTimeoutNs - 3'000'000'000;
static_assert(kSwitchResendNs * 4 < kSwitchResendUntilNs);
// How long a failback a peer asked for waits for the other QPs of its SRQ to be re-connected
// (srq_group.cc) before the peer is told the pair is over: well inside the peer's own wait for
// the answer, which began earlier (its drain, the message's way here).
constexpr std::uint64_t kSrqFailbackWaitNs = kSwitchAnswerTimeoutNs / 2;
static_assert(kSrqFailbackWaitNs + 2 * 1'000'000'000ull < kSwitchAnswerTimeoutNs);
constexpr std::uint64_t kSweepTimeoutNs = 2'000'000'000;
// How long an SRQ's move waits for a member whose pairing is in flight (a peer's answer takes a
// round trip; one that has not come in a second is a peer without the shim, or unreachable).
constexpr std::uint64_t kSrqPairingWaitNs = 1'000'000'000;
// How long a switch's drain waits for the old path's receive queue to flush (drain_old_path).
// A device that flushes ends the wait at once (microseconds on hardware, a few ms on rxe in the
// emulated lab). The bound is for a device that does not flush (or no longer does: a dead one);
// it is paid once per device and back-off (kMarkerRetryFirstNs below), the device being
// drained without a marker in between. It is generous because giving up early can lose a
// message, and the engine's thread may be starved of the CPU: 50 ms ran out on a loaded 2-vCPU
// machine (the fake's late_recv_cqe, and rxe once in the lab) although the flush was coming.
constexpr std::uint64_t kReceiveFlushWaitNs = 1'000'000'000;
// How long the drain polls for the marker before it moves the QP to ERR a second time
// (drain_old_path): long enough for hardware to have written the flush, so that it is spared
// the extra command.
constexpr std::uint64_t kDrainMarkerNudgeNs = 200'000;
static_assert(kDrainMarkerNudgeNs < kReceiveFlushWaitNs);
// The least time a nudge gets to show the flush, even when the engine's thread, starved of the
// CPU, made it close to or past the deadline (rxe flushes within a few ms in the lab).
constexpr std::uint64_t kDrainMarkerAfterNudgeNs = 100'000'000;
static_assert(kDrainMarkerAfterNudgeNs < kReceiveFlushWaitNs);
// After a device missed the marker's deadline, its switches drain without a marker for this
// long, then try it again; each deadline missed in a row doubles the wait, up to the bound. A
// dead device costs its QPs one wait per back-off, not one each; a device that missed once
// (its engine starved of the CPU) is not drained without a marker for the rest of the process.
constexpr std::uint64_t kMarkerRetryFirstNs = 10'000'000'000ull;
constexpr std::uint64_t kMarkerRetryMaxNs = 640'000'000'000ull;
static_assert(kReceiveFlushWaitNs < kMarkerRetryFirstNs && kMarkerRetryFirstNs < kMarkerRetryMaxNs);
static_assert(kMarkerRetryMaxNs % kMarkerRetryFirstNs == 0);
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
// rdma_cm disconnects told over the control channel (cm_disconnect.h): resent at this period, and
// rdma_disconnect waits at most this long for the peer's answer (a peer gone answers never).
constexpr std::uint64_t kCmDisconnectResendNs = 200'000'000;
constexpr std::uint64_t kCmDisconnectWaitNs = 2'000'000'000;
static_assert(kCmDisconnectResendNs * 4 <= kCmDisconnectWaitNs, "a few resends fit the wait");
// The shim gives an rdma_cm id its DISCONNECTED only if the CM's own has not come this long after
// the disconnect was known: on a working path the CM's comes first and the application sees no
// second event to be dropped (a program that poll()s a blocking channel fd would then block).
constexpr std::uint64_t kCmDisconnectGraceNs = 1'000'000'000;
constexpr std::uint64_t kResumeLateNs = 5'000'000'000ull;
// A probe of the idle standby (path_probe.h) fails by its transport retries in about 0.5 s
// (VERBS_FAILOVER_QP_TIMEOUT 14, 6 retries); one with no completion at all after this long (a
// device that lost it, or retries without end) counts as failed too.
constexpr std::uint64_t kProbeAnswerTimeoutNs = 5'000'000'000ull;
// Send-queue slots and shadow CQ entries a standby gets beyond the application's for its probe
// (one in flight at a time): a failover that replays a full ring there finds the probe still in
// the queue, and the probe's completion may sit in the shadow on top of the application's.
constexpr std::uint32_t kProbeSendSlots = 1;
// A standby just connected is not probed for this long: the side that answers a pairing or a
// re-arm connects its end first, and the asker's end only when the answer has crossed the control
// channel and its engine got to it (milliseconds, more under load); a probe before would meet a
// QP still in INIT, which drops it silently, and count as a failure of a sound path.
constexpr std::uint64_t kProbeQuietAfterConnectNs = 3'000'000'000ull;
constexpr std::uint8_t kStandbyRdAtomic = 16;
// The stats file is rewritten when what it says changes (a pairing, a switch, a resume: rare
// events), at most this often, so that a rank ended by a signal (no exit handler runs) leaves a
// file at most this much older than its last change. A storm of changes (hundreds of QPs
// switching one after the other) costs at most ten writes a second.
constexpr std::uint64_t kStatsChangeGapNs = 100'000'000;
static_assert(kStatsChangeGapNs < kRearmRetryNs);

}  // namespace vf::failover
