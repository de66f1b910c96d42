// Entry points for tests and bug reports, exported under the VERBS_FAILOVER_PRIVATE node.
#include "shim/export.h"
#include "shim/port_monitor.h"

// Lets the preload tests prove that a crash inside the shim prints a symbolised stack
// (VERBS_FAILOVER_BACKTRACE=1). Never called by the shim itself.
VF_EXPORT __attribute__((noinline)) void verbs_failover_debug_crash() {
  volatile int* null_pointer = nullptr;
  *null_pointer = 42;
}

VF_EXPORT const char* verbs_failover_version() { return VERBS_FAILOVER_VERSION; }

// Port state changes the shim's port monitor has seen on device/port; -1 if it does not watch
// that port. Lets tests wait for the monitor without reading its log.
VF_EXPORT long verbs_failover_debug_port_changes(const char* device, int port) {
  for (const vf::shim::PortStatus& status : vf::shim::watched_ports()) {
    if (status.device == device && status.port == port) return static_cast<long>(status.changes);
  }
  return -1;
}
