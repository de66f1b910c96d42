// Port and device events: a port going down starts the switch of every QP whose traffic is on it
// and marks its idle paths unusable (the peer is told); a port back ends a hold-down and starts
// re-arming; a standby QP's fatal event fails its path; and which async events the application
// must not see (hide_async_event), since they are the shim's business.
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// A port of the device changed state (its cached state is updated here).
void on_port_change(Engine& e, int device, std::uint8_t port, ibv_port_state state);
// The engine's own context of the device has an async event to read.
void on_device_event(Engine& e, int device);

// Entry point (FailoverEngine, engine mutex held): whether an async event the application is
// about to get must be hidden (a protected port's PORT_ERR/PORT_ACTIVE, a protected QP's fatal
// events). Counted.
bool hide_async_event(Engine& e, ibv_context* context, const ibv_async_event& event);

}  // namespace vf::failover
