// FAKE libibverbs (verbs-failover test double) — the fault-injection / inspection C API declared
// in fake_verbs_control.h (version node FAKE_VERBS_1.0).
#include "fake_verbs_control.h"
#include "internal.h"

using namespace fake_verbs;

namespace {

// By fabric-wide index: with the wire, this process has only its host's devices.
Device* device_at(int index) {
  for (auto& d : fabric().devices)
    if (d->index == index) return d.get();
  return nullptr;
}

// What hardware does to in-flight work when its own link dies: the request at the head times
// out (RETRY_EXC_ERR), the QP enters ERR, everything behind it flushes.
void fail_inflight_work_locked(Device* dev) {
  for (Qp* qp : fabric().qps) {
    if (qp->ctx->device != dev || qp->send_queue.empty()) continue;
    ibv_qp_state st = qp->attr.qp_state;
    if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) continue;
    fail_head_locked(qp, IBV_WC_RETRY_EXC_ERR);
  }
}

}  // namespace

FAKE_EXPORT int fake_verbs_is_fake(void) {
  return 1;
}

FAKE_EXPORT int fake_verbs_device_count(void) {
  auto lock = fabric_lock();
  return int(fabric().devices.size());
}

FAKE_EXPORT int fake_verbs_port_down(int index) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  if (!dev->port_up) return 0;
  dev->port_up = false;
  fake_log("port of %s DOWN (injected)", dev->shell.dev.name);
  raise_device_event_locked(dev, IBV_EVENT_PORT_ERR);
  fail_inflight_work_locked(dev);
  return 0;
}

FAKE_EXPORT int fake_verbs_port_up(int index) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  if (dev->port_up) return 0;
  dev->port_up = true;
  fake_log("port of %s UP (injected)", dev->shell.dev.name);
  raise_device_event_locked(dev, IBV_EVENT_PORT_ACTIVE);
  return 0;
}

FAKE_EXPORT int fake_verbs_move_gid(int index, int from, int to) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr || from < 0 || from >= kGidTableLen || to < 0 || to >= kGidTableLen) return -1;
  if (gid_is_empty(dev->gids[from]) || !gid_is_empty(dev->gids[to])) return -1;
  dev->gids[to] = dev->gids[from];
  dev->gids[from] = ibv_gid{};
  fake_log("GID %d of %s moved to index %d (injected)", from, dev->shell.dev.name, to);
  raise_device_event_locked(dev, IBV_EVENT_GID_CHANGE);
  return 0;
}

FAKE_EXPORT int fake_verbs_set_drop(int index, int enabled) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->drop = enabled != 0;
  fake_log("silent drop on %s %s", dev->shell.dev.name, dev->drop ? "ON" : "OFF");
  return 0;
}

FAKE_EXPORT int fake_verbs_set_lose_acks(int index, unsigned count) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->lose_acks = count;
  fake_log("the next %u acknowledgement(s) to %s lost", count, dev->shell.dev.name);
  return 0;
}

FAKE_EXPORT int fake_verbs_set_delay(int index, unsigned steps) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->delay_steps = steps;
  return 0;
}

FAKE_EXPORT int fake_verbs_set_recv_completion_delay(int index, unsigned steps) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->recv_cqe_delay_steps = steps;
  return 0;
}

FAKE_EXPORT int fake_verbs_set_flush_on_modify_only(int index, int enabled) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->flush_on_modify_only = enabled != 0;
  return 0;
}

FAKE_EXPORT int fake_verbs_set_retry_without_end_at_7(int index, int enabled) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  dev->retry_without_end_at_7 = enabled != 0;
  return 0;
}

FAKE_EXPORT void fake_verbs_progress(void) {
  auto lock = fabric_lock();
  progress_step_locked();
}

FAKE_EXPORT uint64_t fake_verbs_progress_steps(void) {
  auto lock = fabric_lock();
  return fabric().step;
}

FAKE_EXPORT int fake_verbs_query_qp_stats(uint32_t qp_num, fake_verbs_qp_stats* out) {
  auto lock = fabric_lock();
  for (Qp* qp : fabric().qps) {
    if (qp->shell.qpx.qp_base.qp_num != qp_num) continue;
    out->messages_sent = qp->stats.messages_sent;
    out->messages_received = qp->stats.messages_received;
    out->rnr_naks = qp->stats.rnr_naks;
    out->transport_retries = qp->stats.transport_retries;
    out->completions_with_error = qp->stats.completions_with_error;
    out->ece_options = qp->ece_options;
    out->device_index = qp->ctx->device->index;
    out->qp_state = qp->attr.qp_state;
    return 0;
  }
  return -1;
}

FAKE_EXPORT int fake_verbs_list_qps(int device_index, uint32_t* qp_nums, int max) {
  auto lock = fabric_lock();
  if (device_at(device_index) == nullptr) return -1;
  int count = 0;
  for (Qp* qp : fabric().qps) {
    if (qp->ctx->device->index != device_index) continue;
    if (count < max) qp_nums[count] = qp->shell.qpx.qp_base.qp_num;
    ++count;
  }
  return count;
}

FAKE_EXPORT int fake_verbs_query_device_stats(int index, fake_verbs_device_stats* out) {
  auto lock = fabric_lock();
  Device* dev = device_at(index);
  if (dev == nullptr) return -1;
  out->tx_messages = dev->stats.tx_messages;
  out->rx_messages = dev->stats.rx_messages;
  out->dropped_packets = dev->stats.dropped_packets;
  out->acks_lost = dev->stats.acks_lost;
  return 0;
}

FAKE_EXPORT void fake_verbs_reset(void) {
  auto lock = fabric_lock();
  for (auto& dev : fabric().devices) {
    dev->port_up = true;
    dev->drop = false;
    dev->delay_steps = 0;
    dev->recv_cqe_delay_steps = 0;
    dev->flush_on_modify_only = false;
    dev->retry_without_end_at_7 = false;
    dev->stats = DeviceStats{};
    set_default_gids(*dev);
  }
  for (Qp* qp : fabric().qps) qp->stats = QpStats{};
}
