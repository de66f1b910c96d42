// The shim's side of the failover engine's wiring (see failover_bridge.cc).
#pragma once

#include "core/config.h"

namespace vf::shim {

// At initialisation, when the shim is active: hands the engine the real verbs. The engine opens
// nothing until the application opens a device.
void configure_failover(const Config& config);

}  // namespace vf::shim
