// Devices and ports: the devices the engine opens (its own context on each), which port backs up
// which (VERBS_FAILOVER_PAIRS or the automatic rule, core/device_pairs.h), GIDs, and whether a
// port is ACTIVE as last seen.
#pragma once

#include <string>

#include <cstdint>

#include "core/failover/engine_state.h"

namespace vf::failover {

Gid gid_of(const ibv_gid& gid);
ibv_gid to_ibv_gid(const Gid& gid);
// A GID as the kernel and rdma-core print it (IPv6 notation: ::ffff:10.0.0.1 for RoCEv2 IPv4).
std::string gid_text(const Gid& gid);

// The engine's index of the device an application context belongs to, -1 if none.
int device_of_context(Engine& e, const ibv_context* context);

// The GID index the standby uses on its port: the first IPv4-mapped GID (RoCEv2 on rxe; the
// RoCE fabrics this was built for), else index 0 (InfiniBand).
int standby_gid_index(Engine& e, int device, std::uint8_t port, Gid* gid);

// Once, at start: opens the engine's context on every device, reads their ports, and chooses
// each port's backup (VERBS_FAILOVER_PAIRS, else automatic_pairs). A port without one is
// logged: its QPs run pass-through.
void discover_devices(Engine& e);

// Whether gid is one of the port's GIDs (asked of the device).
bool gid_of_port(Engine& e, int device, std::uint8_t port, const Gid& gid);

// Whether the port was ACTIVE at its last event (the cached state; see port_events.h).
bool port_active(Engine& e, int device, std::uint8_t port);
// ACTIVE, and for Engine::port_stable_ns since it last came back (a flapping port is not re-used
// between its flaps). Logs once per return while it waits.
bool port_stable(Engine& e, int device, std::uint8_t port, std::uint64_t now);

}  // namespace vf::failover
