// The maps the data path finds its objects in: the VirtualQp of an application QP, the CqState of
// an application CQ, the VirtualQp of a physical QP number (for completions). The engine fills
// them (failover_engine.cc); these inline lookups are what post_send, post_recv and poll_cq pay.
//
// Why globals: they are constant-initialised (zero pages, no constructor, nothing to run before
// the first verb and nothing destroyed while the engine's thread may still read them), and an
// inline lookup in the hooks costs a hash and one or two loads, not three calls through
// function-local statics.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "core/object_registry.h"

namespace vf {

class VirtualQp;
struct CqState;

using VirtualQpRegistry = ObjectRegistry<VirtualQp, 1 << 16>;
using QpnRegistry = ObjectRegistry<VirtualQp, 1 << 17>;
using CqRegistry = ObjectRegistry<CqState, 1 << 14>;

namespace datapath_registries {
extern VirtualQpRegistry qps_by_address;
extern QpnRegistry qps_by_qpn;
extern CqRegistry cqs_by_address;
}  // namespace datapath_registries

// The key of a physical QP number on a device (device indexes start at 0; 0 is never a key).
inline const void* qpn_registry_key(int device, std::uint32_t qpn) {
  return reinterpret_cast<const void*>((static_cast<std::uint64_t>(device + 1) << 32) | qpn);
}

inline VirtualQp* find_virtual_qp(const ibv_qp* qp) {
  return datapath_registries::qps_by_address.find(qp);
}
inline CqState* find_cq_state(const ibv_cq* cq) {
  return datapath_registries::cqs_by_address.find(cq);
}
inline VirtualQp* find_virtual_qp_by_qpn(int device, std::uint32_t qpn) {
  return datapath_registries::qps_by_qpn.find(qpn_registry_key(device, qpn));
}

}  // namespace vf
