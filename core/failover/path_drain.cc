#include "core/failover/path_drain.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/qp_transitions.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// This side's half: stop the old path, take what it completed, count what it delivered, move
// the receives. Returns false if the switch cannot happen.
// Posts the drain marker on a path's QP that is in ERR. Not for a QP on an SRQ: it has no
// receive queue of its own to flush (an SRQ is never flushed).
bool post_drain_marker(Engine& e, Protection& p, int path) {
  VirtualQp& v = *p.qp;
  if (v.srq != nullptr) return false;
  const Device& device = e.devices[v.path[path].device_index];
  if (device.marker_flush == Device::MarkerFlush::kNo &&
      monotonic_ns() < device.marker_retry_at_ns) {
    return false;
  }
  ibv_qp* qp = v.path[path].qp;
  // The flush of an earlier drain's marker that came after that drain gave up may still sit in
  // the CQ (one the application does not poll: a retired shadow): taken first, it cannot end this
  // drain before this marker's own flush.
  v.recv_cq->drain_into_stash(path);
  v.lock().lock();
  v.clear_drain_marker(path);
  v.lock().unlock();
  ibv_recv_wr marker{};
  marker.wr_id = kDrainMarkerWrId;
  ibv_recv_wr* bad = nullptr;
  const int result = e.verbs.provider_ops(qp->context)->post_recv(qp, &marker, &bad);
  if (result != 0) {
    VF_LOG_DEBUG("qp {}: no drain marker on the {} path ({}); its drain takes what is there",
                 v.vqpn, path_name(path), strerror(result));
    return false;
  }
  return true;
}

// The marker missed its deadline: the device's switches drain without one for a back-off that
// doubles with each miss in a row. A device that stopped flushing (one that died) must not charge
// the full wait to each of its QPs in turn, with the engine's lock held; one that missed once
// (its engine starved of the CPU, a flush storm) gets the marker again later.
void give_up_marker(Device& device, std::uint32_t vqpn, int from) {
  const Device::MarkerFlush before = device.marker_flush;
  device.marker_flush = Device::MarkerFlush::kNo;
  device.marker_backoff_ns = device.marker_backoff_ns == 0
                                 ? kMarkerRetryFirstNs
                                 : std::min(2 * device.marker_backoff_ns, kMarkerRetryMaxNs);
  device.marker_retry_at_ns = monotonic_ns() + device.marker_backoff_ns;
  if (before == Device::MarkerFlush::kUnknown) {
    VF_LOG_WARN(
        "failover: {} did not flush a receive posted to a QP in ERR within {} ms (qp {}); its "
        "switches drain what its CQ holds for the next {} s, and a receive completion it "
        "writes after its ACK would not be counted",
        device.name, kReceiveFlushWaitNs / 1'000'000, vqpn,
        device.marker_backoff_ns / 1'000'000'000);
  } else {
    VF_LOG_WARN(
        "qp {}: the {} path's receive queue did not flush within {} ms of ERR; a receive "
        "completion its device writes later is not counted, and {}'s switches drain without a "
        "marker for the next {} s",
        vqpn, path_name(from), kReceiveFlushWaitNs / 1'000'000, device.name,
        device.marker_backoff_ns / 1'000'000'000);
  }
}

}  // namespace

void drain_old_path(Engine& e, Protection& p, int from, bool in_error) {
  VirtualQp& v = *p.qp;
  const bool marked = in_error && post_drain_marker(e, p, from);
  const std::uint64_t start = monotonic_ns();
  std::uint64_t deadline = start + kReceiveFlushWaitNs;
  bool nudged = false;
  for (unsigned round = 1;; ++round) {
    v.send_cq->drain_into_stash(from);
    if (v.recv_cq != v.send_cq) v.recv_cq->drain_into_stash(from);
    if (!marked) return;
    v.lock().lock();
    const bool seen = v.drain_marker_seen(from);
    v.lock().unlock();
    Device& device = e.devices[v.path[from].device_index];
    if (seen) {
      device.marker_flush = Device::MarkerFlush::kYes;
      device.marker_backoff_ns = 0;
      return;
    }
    const std::uint64_t now = monotonic_ns();
    if (!nudged && now - start >= kDrainMarkerNudgeNs) {
      // rxe flushes a receive queue only when its responder runs in ERR, which the move to ERR
      // schedules once: a marker posted after that run stays until the next. Moving the QP to
      // ERR again (ERR -> ERR is a legal transition) schedules another; on a device that
      // flushes by itself it only costs the call.
      nudged = true;
      // A nudge made late (the thread starved of the CPU) still gets its time to flush.
      deadline = std::max(deadline, now + kDrainMarkerAfterNudgeNs);
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      const int result = modify(e, v.path[from].qp, &attr, IBV_QP_STATE, from == kPrimary);
      if (result != 0) {
        VF_LOG_DEBUG("qp {}: moving the {} path to ERR again failed ({})", v.vqpn, path_name(from),
                     strerror(result));
      }
    }
    if (now >= deadline) {
      // A thread starved of the CPU between the last poll and this clock read would conclude
      // without having looked after the flush came: one more drain decides.
      v.send_cq->drain_into_stash(from);
      if (v.recv_cq != v.send_cq) v.recv_cq->drain_into_stash(from);
      v.lock().lock();
      const bool seen_late = v.drain_marker_seen(from);
      v.lock().unlock();
      if (seen_late) {
        device.marker_flush = Device::MarkerFlush::kYes;
        device.marker_backoff_ns = 0;
        return;
      }
      give_up_marker(device, v.vqpn, from);
      return;
    }
    // Polls back to back (a flush takes microseconds), giving the CPU away now and then.
    if (round % 64 == 0) sched_yield();
  }
}

}  // namespace vf::failover
