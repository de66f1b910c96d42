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

// All zeros: what an empty GID table slot reads as, or a GID the device did not give.
bool gid_is_zero(const Gid& gid);

// The engine's index of the device an application context belongs to, -1 if none.
int device_of_context(Engine& e, const ibv_context* context);

// The GID index the standby uses on its port: the first IPv4-mapped GID of type RoCE v2 (a NIC
// with v1 and v2 lists each address twice, v1 first; v1 frames are not routable), else the first
// IPv4-mapped GID (types unknown), else the first GID (InfiniBand). Its type in *type if asked.
int standby_gid_index(Engine& e, int device, std::uint8_t port, Gid* gid, int* type = nullptr);

// The type (IBV_GID_TYPE_*) of the GID at an index, -1 if unknown.
int gid_type_at(Engine& e, int device, std::uint8_t port, int index);

// Once, at start: opens the engine's context on every device, reads their ports, and chooses
// each port's backup (VERBS_FAILOVER_PAIRS, else automatic_pairs). A port without one is
// logged: its QPs run pass-through.
void discover_devices(Engine& e);

// Where gid (of this type; -1: any) is in the port's GID table now (asked of the device): `hint`
// if it still holds it, else the first slot that does; -1 if none (a zero GID is never found). A
// RoCE GID's index is not fixed: an address removed and added again takes the first free slot.
int gid_index_of(Engine& e, int device, std::uint8_t port, const Gid& gid, int type = -1,
                 int hint = -1);
// Whether gid is one of the port's GIDs (asked of the device).
bool gid_of_port(Engine& e, int device, std::uint8_t port, const Gid& gid);

// Whether the port was ACTIVE at its last event (the cached state; see port_events.h).
bool port_active(Engine& e, int device, std::uint8_t port);
// ACTIVE, and for Engine::port_stable_ns since it last came back (a flapping port is not re-used
// between its flaps). Logs once per return while it waits.
bool port_stable(Engine& e, int device, std::uint8_t port, std::uint64_t now);

}  // namespace vf::failover
