#include "core/failover/cq_shadows.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// The CQ's events of the stash (and, once it has one, of its shadow) come through the channel's
// wake fd from now on.
void attach_to_channel(ChannelState& channel, CqState& state) {
  if (std::find(channel.cqs.begin(), channel.cqs.end(), &state) == channel.cqs.end()) {
    channel.cqs.push_back(&state);
  }
  state.wake_fd = channel.wake_fd;
}

}  // namespace

void cq_created(Engine& e, ibv_cq* cq, ibv_comp_channel* channel) {
  if (!engine_running(e) || cq == nullptr) return;
  const int device = device_of_context(e, cq->context);
  if (device < 0) return;
  const ibv_context_ops* ops = e.verbs.provider_ops(cq->context);
  auto state =
      std::make_unique<CqState>(cq, device, ops, static_cast<std::uint32_t>(2 * cq->cqe + 64));
  state->app_channel = channel;
  if (!datapath_registries::cqs_by_address.insert(cq, state.get())) return;
  auto replaced = channel == nullptr ? e.channels.end() : e.channels.find(channel);
  if (replaced != e.channels.end() && replaced->second.epoll_fd >= 0) {
    attach_to_channel(replaced->second, *state);
  }
  e.cqs[cq] = std::move(state);
}

namespace {

// A QP still uses it: the provider refuses the destroy (EBUSY) and the CQ lives on.
bool in_use(Engine& e, const CqState* state) {
  for (auto& [key, p] : e.protections) {
    if (!p.destroyed && (p.qp->send_cq == state || p.qp->recv_cq == state)) return true;
  }
  return false;
}

}  // namespace

bool cq_close_events(Engine& e, ibv_cq* cq) {
  auto it = e.cqs.find(cq);
  if (it == e.cqs.end()) return true;
  CqState* state = it->second.get();
  if (in_use(e, state)) return false;
  // No event of it is handed out or announced from here on; those due and not taken go with
  // it, and so do their tokens (tokens are any CQ's of the channel: a waiter that took one of
  // these meanwhile takes another CQ's event with it, or finds nothing and waits again).
  const std::uint32_t due = state->shadow_events.close();
  for (auto& [ptr, channel] : e.channels) {
    if (std::erase(channel.cqs, state) == 0) continue;
    for (std::uint32_t n = due; n > 0; --n) {
      eventfd_t token = 0;
      eventfd_read(channel.wake_fd, &token);
    }
  }
  return true;
}

void cq_destroying(Engine& e, ibv_cq* cq) {
  auto it = e.cqs.find(cq);
  if (it == e.cqs.end()) return;
  CqState* state = it->second.get();
  if (!cq_close_events(e, cq)) return;
  datapath_registries::cqs_by_address.erase(cq);
  state->lock.lock();  // no poller is inside any more
  state->lock.unlock();
  if (state->shadow != nullptr) e.verbs.destroy_cq(state->shadow);
  // The record itself stays: a thread that read the registry just before the erase may still
  // hold it (CQ destruction is rare; the few bytes are not worth a use-after-free).
  it->second.release();
  e.cqs.erase(it);
}

void cq_resized(Engine& e, ibv_cq* cq) {
  auto it = e.cqs.find(cq);
  if (it == e.cqs.end()) return;
  CqState& state = *it->second;
  // The shadow must hold as many completions as the application's CQ now does, and the stash
  // twice as many (what a switch drains into it).
  // The application's size plus the shim's entries; at least the application's size when the
  // device cannot give more (the shim reports an overrun if one happens: port_events.cc).
  const int wanted = cq->cqe + static_cast<int>(state.shim_entries);
  if (state.shadow != nullptr && e.verbs.resize_cq != nullptr &&
      e.verbs.resize_cq(state.shadow, wanted) != 0 &&
      (wanted == cq->cqe || e.verbs.resize_cq(state.shadow, cq->cqe) != 0)) {
    VF_LOG_WARN("cq {}: resizing its shadow to {} failed; a switch may overflow it",
                static_cast<const void*>(cq), wanted);
  }
  state.lock.lock();
  state.stash.grow(static_cast<std::uint32_t>(2 * cq->cqe + 64));
  state.lock.unlock();
}

bool ensure_shadow(Engine& e, CqState& state, int backup_device) {
  if (state.shadow != nullptr) return state.shadow_device_index == backup_device;
  ibv_comp_channel* shadow_channel = nullptr;
  if (state.app_channel != nullptr) {
    ChannelState& channel = e.channels[state.app_channel];
    if (channel.app_channel == nullptr) {
      channel.app_channel = state.app_channel;
      channel.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
    }
    if (channel.shadow_channel == nullptr) {
      channel.shadow_channel = e.verbs.create_comp_channel(e.devices[backup_device].context);
      if (channel.shadow_channel == nullptr) return false;
      // The engine reads it under its mutex: an event the kernel dropped since poll() said
      // readable (its CQ destroyed meanwhile) must not block it there for good.
      const int flags = fcntl(channel.shadow_channel->fd, F_GETFL);
      if (flags >= 0) fcntl(channel.shadow_channel->fd, F_SETFL, flags | O_NONBLOCK);
      wake_engine(e);
    }
    shadow_channel = channel.shadow_channel;
    attach_to_channel(channel, state);
  }
  state.shadow = e.verbs.create_cq(e.devices[backup_device].context,
                                   state.app_cq->cqe + static_cast<int>(state.shim_entries),
                                   nullptr, shadow_channel, 0);
  if (state.shadow == nullptr) return false;
  state.shadow_device_index = backup_device;
  state.shadow_channel = shadow_channel;
  if (shadow_channel != nullptr) ibv_req_notify_cq(state.shadow, 0);
  return true;
}

unsigned int ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  CqState* state = find_cq_state(cq);
  if (state == nullptr) return nevents;
  return nevents - state->shadow_events.acknowledge(nevents);
}

void req_notify(ibv_cq* cq, int solicited_only) {
  CqState* state = find_cq_state(cq);
  if (state == nullptr) return;
  state->notify_armed.store(true);
  state->notify_solicited_only.store(solicited_only != 0);
  if (state->shadow == nullptr || state->shadow_channel == nullptr) return;
  ibv_req_notify_cq(state->shadow, solicited_only);
}

void retire_shadow_if_unused(Engine& e, CqState& cq) {
  if (!cq.shadow_active.load()) return;
  for (const auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    const VirtualQp& v = *p.qp;
    if (v.send_cq != &cq && v.recv_cq != &cq) continue;
    if (p.sw.in_progress || v.active_path() == kStandby) return;
  }
  // Drained and marked inactive under one hold of the CQ's lock: a poller after it finds the
  // shadow's completions in the stash, and none polls the shadow any more, so the engine may poll
  // it without the lock (CqState::poll_idle_shadow).
  cq.lock.lock();
  cq.drain_into_stash_locked(kStandby);
  cq.shadow_active.store(false);
  cq.lock.unlock();
}

bool reserve_shadow_entries(Engine& e, CqState& state, std::uint32_t entries) {
  state.shim_entries += entries;
  const int wanted = state.app_cq->cqe + static_cast<int>(state.shim_entries);
  if (state.shadow == nullptr || state.shadow->cqe >= wanted) return true;
  if (e.verbs.resize_cq == nullptr || e.verbs.resize_cq(state.shadow, wanted) != 0) {
    VF_LOG_WARN("cq {}: growing its shadow to {} entries failed; a switch may overrun it (the "
                "shim reports it if it does)",
                static_cast<const void*>(state.app_cq), wanted);
    return false;
  }
  return true;
}

}  // namespace vf::failover
