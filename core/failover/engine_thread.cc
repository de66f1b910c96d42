#include "core/failover/engine_thread.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <system_error>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/failover/cm_disconnect.h"
#include "core/failover/devices.h"
#include "core/failover/engine_stats.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/message_dispatch.h"
#include "core/failover/path_probe.h"
#include "core/failover/periodic_work.h"
#include "core/failover/port_events.h"
#include "core/log.h"
#include "core/spin_lock.h"

namespace vf::failover {

namespace {

void handle_shadow_channel(Engine& e, ChannelState& channel) {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (e.verbs.get_cq_event(channel.shadow_channel, &cq, &context) != 0) return;
  e.verbs.ack_cq_events(cq, 1);
  for (CqState* state : channel.cqs) {
    if (state->shadow == cq) {
      // The shim's own completions (a probe of an idle standby: path_probe.h) raise the
      // shadow's event too, and the application must not wake for them: the shadow is polled
      // into the stash first, and an event with nothing for the application re-arms the shadow
      // instead (then looks once more: a completion that came before the re-arm raises none).
      // Only while no QP runs on the shadow (the application polls it otherwise, and a
      // probe's completion there may then cost it one empty wake-up); without the CQ's lock.
      if (!state->shadow_active.load() && !state->stash_nonempty.load() &&
          !state->poll_idle_shadow()) {
        ibv_req_notify_cq(state->shadow, state->notify_solicited_only.load() ? 1 : 0);
        if (!state->poll_idle_shadow()) continue;
      }
      // One event per arming, as on the application's CQ: its ibv_req_notify_cq re-arms both.
      // Counted first, then announced: the semaphore eventfd never holds more tokens than there
      // are events to take (channel_wakeup.cc).
      if (state->shadow_events.add_due()) eventfd_write(channel.wake_fd, 1);
    }
  }
}

void run_engine(Engine& e) {
  // It takes many locks in a row during a switch: it must never become their biased owner.
  SpinLock::never_bias_this_thread();
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    std::size_t device_first = 0, channel_first = 0, comp_first = 0;
    // (application channel, its shadow channel): found again after the wait, a channel may have
    // been destroyed meanwhile (channel_wakeup.cc)
    std::vector<std::pair<ibv_comp_channel*, ibv_comp_channel*>> comp_channels;
    {
      std::lock_guard lock(e.mutex);
      fds.push_back({e.wake_fd, POLLIN, 0});
      device_first = fds.size();
      for (int i = 0; i < e.device_count; ++i)
        fds.push_back({e.devices[i].context->async_fd, POLLIN, 0});
      comp_first = fds.size();
      for (auto& [ptr, channel] : e.channels) {
        if (channel.shadow_channel == nullptr) continue;
        fds.push_back({channel.shadow_channel->fd, POLLIN, 0});
        comp_channels.emplace_back(ptr, channel.shadow_channel);
      }
      channel_first = fds.size();
      e.channel.collect(fds);
    }
    int timeout_ms = -1;
    {
      std::lock_guard lock(e.mutex);
      if (has_pending_work(e) || !e.local_inbox.empty() || !e.outbox.empty() ||
          !e.cm_pending.empty() || !e.cm_disconnects_due.empty()) {
        timeout_ms = 20;
      }
      if (const std::uint64_t due = next_probe_due_ns(e); due != 0) {
        const std::uint64_t now = monotonic_ns();
        const int until_probe = due > now ? static_cast<int>((due - now) / 1000000) + 1 : 0;
        timeout_ms = timeout_ms < 0 ? until_probe : std::min(timeout_ms, until_probe);
      }
      if (e.config.stats_interval_s > 0) {
        const std::uint64_t now = monotonic_ns();
        const int until_stats =
            e.next_stats_ns > now ? static_cast<int>((e.next_stats_ns - now) / 1000000) + 1 : 0;
        timeout_ms = timeout_ms < 0 ? until_stats : std::min(timeout_ms, until_stats);
      }
      if (!e.config.stats_file.empty() && stats_changed(e)) {  // held back by kStatsChangeGapNs
        const std::uint64_t now = monotonic_ns();
        const int until_change = e.next_change_stats_ns > now
                                     ? static_cast<int>((e.next_change_stats_ns - now) / 1000000) + 1
                                     : 0;
        timeout_ms = timeout_ms < 0 ? until_change : std::min(timeout_ms, until_change);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      VF_LOG_ERROR("failover: the engine's poll failed ({}); failover is off", strerror(errno));
      return;
    }
    const char* write_stats_now = nullptr;
    {
      std::lock_guard lock(e.mutex);
      if (fds[0].revents & POLLIN) {
        eventfd_t ignored = 0;
        eventfd_read(e.wake_fd, &ignored);
      }
      for (std::size_t k = device_first; k < comp_first; ++k) {
        if (fds[k].revents & POLLIN) on_device_event(e, static_cast<int>(k - device_first));
      }
      for (std::size_t k = comp_first; k < channel_first; ++k) {
        if (!(fds[k].revents & POLLIN)) continue;
        const auto [app_channel, shadow_channel] = comp_channels[k - comp_first];
        auto it = e.channels.find(app_channel);
        if (it != e.channels.end() && it->second.shadow_channel == shadow_channel) {
          handle_shadow_channel(e, it->second);
        }
      }
      e.channel.handle(
          fds, channel_first,
          [&](ControlSession& session, ControlMessage& message) {
            on_session_message(e, session, message);
          },
          [&](const ControlSession& closed) { on_session_closed(e, closed); });
      while (!e.local_inbox.empty()) {
        auto inbox = std::move(e.local_inbox);
        e.local_inbox.clear();
        PeerRef self;
        self.local = true;
        for (auto& [ignored, message] : inbox) process_message(e, self, 0, message);
      }
      flush_outbox(e);
      send_cm_disconnects(e);
      periodic_work(e);
      if (e.config.stats_interval_s > 0 && monotonic_ns() >= e.next_stats_ns) {
        e.next_stats_ns =
            monotonic_ns() + static_cast<std::uint64_t>(e.config.stats_interval_s * 1e9);
        write_stats_now = "interval";
      }
      if (write_stats_now == nullptr && !e.config.stats_file.empty() &&
          monotonic_ns() >= e.next_change_stats_ns && stats_changed(e)) {
        e.next_change_stats_ns = monotonic_ns() + kStatsChangeGapNs;
        write_stats_now = "change";
      }
    }
    {
      std::unique_lock lock(e.mutex);
      run_cm_disconnect_handler(e, lock);
    }
    if (write_stats_now != nullptr) write_stats(e, write_stats_now);
  }
}

// The engine the data path's services and the exit handler reach: they are plain function
// pointers (DatapathServices, atexit), and a process starts one engine.
Engine* serving_engine = nullptr;

void wake_serving_engine() {
  wake_engine(*serving_engine);
}
void write_stats_at_exit() {
  write_stats(*serving_engine, "exit");
}

}  // namespace

bool start_engine(Engine& e) {
  if (e.started) return true;
  if (e.start_failed) return false;
  e.started = true;
  discover_devices(e);
  e.token = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
            static_cast<std::uint64_t>(::getpid());
  e.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::string error;
  if (!e.channel.listen(e.config.ctrl_port_first, e.config.ctrl_port_last, error)) {
    VF_LOG_WARN(
        "failover: control channel unavailable ({}); QPs of peers that contact us cannot "
        "pair",
        error);
  }
  std::vector<std::uint32_t> rails;
  for (int i = 0; i < e.device_count; ++i) {
    for (std::uint8_t port = 1; port <= e.devices[i].port_count; ++port) {
      Gid gid{};
      standby_gid_index(e, i, port, &gid);
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
  serving_engine = &e;
  DatapathServices services;
  services.translate_lkey = translate_lkey;
  services.translate_rkey = translate_rkey;
  services.wake_engine = wake_serving_engine;
  set_datapath_services(services);
  if (e.config.stats_interval_s > 0) {
    e.next_stats_ns = monotonic_ns() + static_cast<std::uint64_t>(e.config.stats_interval_s * 1e9);
  }
  // The engine's thread takes none of the application's signals (it inherits this mask): a
  // handler run on it could call exit() while it writes the stats file, and the exit handler
  // would then wait for the lock its own thread holds.
  sigset_t all_signals, saved_mask;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_BLOCK, &all_signals, &saved_mask);
  try {
    std::thread(run_engine, std::ref(e)).detach();
    pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr);
  } catch (const std::system_error& failure) {
    pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr);
    VF_LOG_WARN("failover: cannot start the engine thread ({}); running unprotected",
                failure.what());
    e.start_failed = true;
    return false;
  }
  if (!e.config.stats_file.empty()) atexit(write_stats_at_exit);
  // Probed here, off the data path (the first claim would otherwise pay the syscalls).
  const bool biased_locks = SpinLock::bias_available();
  VF_LOG_DEBUG(
      "failover: engine started, control port {}; data-path locks {}", e.channel.port(),
      biased_locks ? "biased to their thread (membarrier)" : "without bias (no membarrier)");
  return true;
}

}  // namespace vf::failover
