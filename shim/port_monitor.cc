#include "shim/port_monitor.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/spin_lock.h"
#include "core/verbs_names.h"
#include "shim/real_verbs.h"
#include "shim/shim_state.h"

namespace vf::shim {
namespace {

constexpr std::uint8_t kMaxPorts = 8;
constexpr std::size_t kMaxWatchedDevices = 64;

struct WatchedDevice {
  ibv_device* device = nullptr;
  ibv_context* context = nullptr;  // the monitor's own
  std::string name;
  std::uint8_t ports = 0;
  ibv_port_state state[kMaxPorts + 1] = {};
  std::uint64_t changes[kMaxPorts + 1] = {};
};

// Heap-allocated and never freed: the thread may still run while the process exits, and must not
// find its state destroyed by static destructors.
struct Monitor {
  std::mutex mutex;
  std::vector<WatchedDevice> devices;
  int wake_fd = -1;  // eventfd: a device was added
  bool thread_running = false;
};

Monitor& monitor() {
  static Monitor* instance = new Monitor;
  return *instance;
}

// The monitor's context was opened with the real ibv_open_device, so it is not patched: the
// inline ibv_query_port goes straight to the provider.
ibv_port_state query_state(ibv_context* context, std::uint8_t port) {
  ibv_port_attr attr{};
  if (ibv_query_port(context, port, &attr) != 0) return IBV_PORT_NOP;
  return attr.state;
}

// Re-reads the port the event names (the event says something changed; the port says what it is
// now, which also covers events merged or missed while the thread was busy).
void on_port_event(WatchedDevice& watched, const ibv_async_event& event) {
  const int port = event.element.port_num;
  if (port < 1 || port > watched.ports) return;
  const ibv_port_state now = query_state(watched.context, static_cast<std::uint8_t>(port));
  std::lock_guard lock(monitor().mutex);
  const ibv_port_state before = watched.state[port];
  if (now == before) return;
  watched.state[port] = now;
  ++watched.changes[port];
  VF_LOG_INFO("port {}/{} is {} (was {}; {})", watched.name, port, port_state_name(now),
              port_state_name(before), real_verbs().ibv_event_type_str(event.event_type));
}

void run_monitor() {
  // A shim thread: it must never become the biased owner of a data-path lock it reaches.
  vf::SpinLock::never_bias_this_thread();
  Monitor& m = monitor();
  std::vector<pollfd> fds;
  std::vector<std::size_t> index_of_fd;
  for (;;) {
    {
      std::lock_guard lock(m.mutex);
      fds.assign(1, pollfd{m.wake_fd, POLLIN, 0});
      index_of_fd.assign(1, 0);
      for (std::size_t i = 0; i < m.devices.size(); ++i) {
        fds.push_back({m.devices[i].context->async_fd, POLLIN, 0});
        index_of_fd.push_back(i);
      }
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      VF_LOG_ERROR("port monitor: poll failed ({}); port changes are no longer watched",
                   strerror(errno));
      return;
    }
    if (fds[0].revents & POLLIN) {
      eventfd_t ignored = 0;
      eventfd_read(m.wake_fd, &ignored);
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & POLLIN)) continue;
      WatchedDevice* watched = nullptr;
      {
        std::lock_guard lock(m.mutex);
        watched = &m.devices[index_of_fd[k]];
      }
      ibv_async_event event{};
      // poll() said an event is queued, so this does not block.
      if (real_verbs().ibv_get_async_event(watched->context, &event) != 0) continue;
      switch (event.event_type) {
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
          on_port_event(*watched, event);
          break;
        default:
          break;  // QP/CQ events of the monitor's own context: it has none
      }
      real_verbs().ibv_ack_async_event(&event);
    }
  }
}

void fork_prepare() { monitor().mutex.lock(); }
void fork_parent() { monitor().mutex.unlock(); }
// The child has no monitor thread, and contexts opened by the parent are not usable in it: it
// forgets them (without closing: their fds belong to the parent's open files) and starts afresh
// when the child opens a device.
void fork_child() {
  Monitor& m = monitor();
  m.devices.clear();
  m.thread_running = false;
  m.mutex.unlock();
}

}  // namespace

void watch_ports_of(ibv_device* device) {
  if (device == nullptr || !shim_active()) return;
  Monitor& m = monitor();
  std::lock_guard lock(m.mutex);
  if (std::any_of(m.devices.begin(), m.devices.end(),
                  [&](const WatchedDevice& w) { return w.device == device; })) {
    return;
  }
  if (m.devices.size() >= kMaxWatchedDevices) return;
  // Grow before adding, so the thread's pointers into the vector stay valid (it reads them only
  // under the lock, after the wake-up).
  if (m.devices.capacity() < kMaxWatchedDevices) m.devices.reserve(kMaxWatchedDevices);
  WatchedDevice watched;
  watched.device = device;
  watched.name = device->name;
  watched.context = real_verbs().ibv_open_device(device);
  if (watched.context == nullptr) {
    VF_LOG_WARN("port monitor: cannot open {} ({}); its ports are not watched", watched.name,
                strerror(errno));
    return;
  }
  ibv_device_attr attr{};
  if (real_verbs().ibv_query_device(watched.context, &attr) == 0) {
    watched.ports = std::min<std::uint8_t>(attr.phys_port_cnt, kMaxPorts);
  }
  for (std::uint8_t port = 1; port <= watched.ports; ++port) {
    watched.state[port] = query_state(watched.context, port);
  }
  VF_LOG_DEBUG("port monitor: watching {} ({} port(s))", watched.name, watched.ports);
  m.devices.push_back(std::move(watched));
  if (m.wake_fd < 0) m.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!m.thread_running) {
    try {
      std::thread(run_monitor).detach();
      m.thread_running = true;
    } catch (const std::system_error& error) {
      VF_LOG_WARN("port monitor: cannot start its thread ({}); ports are not watched",
                  error.what());
    }
  }
  eventfd_write(m.wake_fd, 1);
}

std::vector<PortStatus> watched_ports() {
  Monitor& m = monitor();
  std::lock_guard lock(m.mutex);
  std::vector<PortStatus> out;
  for (const WatchedDevice& watched : m.devices) {
    for (std::uint8_t port = 1; port <= watched.ports; ++port) {
      out.push_back({watched.name, port, watched.state[port], watched.changes[port]});
    }
  }
  return out;
}

void register_port_monitor_for_fork() {
  register_fork_participant({fork_prepare, fork_parent, fork_child});
}

}  // namespace vf::shim
