// The shim's own watch on every port the application uses. It opens a context of its own on
// each device (async events go to every context of a device, so the application's stream is
// untouched) and follows port state changes from a background thread — milliseconds after the
// kernel reports them, instead of the ~30 s an RC transport timeout takes. Today it logs the
// changes and counts them; the failover work makes them trigger failover (docs/design.md §5).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vf::shim {

// Starts watching the device a context was just opened on (once per device; the first call
// starts the thread). Failures are logged, never returned: watching is best effort.
void watch_ports_of(ibv_device* device);

struct PortStatus {
  std::string device;
  std::uint8_t port = 0;
  ibv_port_state state = IBV_PORT_NOP;
  std::uint64_t changes = 0;  // state changes the monitor observed
};

// A snapshot of every watched port.
std::vector<PortStatus> watched_ports();

// Registers the monitor's fork handling (called once during initialisation).
void register_port_monitor_for_fork();

}  // namespace vf::shim
