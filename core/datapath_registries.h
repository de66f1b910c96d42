// The maps the data path finds its objects in: the VirtualQp of an application QP, the CqState of
// an application CQ, the VirtualQp of a physical QP number (for completions), the VirtualSrq of an
// application SRQ, and the key translations a replay on the standby needs (lkeys of this
// process's registrations, rkeys of the peers'). The engine fills them (core/failover/); these
// inline lookups are what post_send, post_recv and poll_cq pay.
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
class VirtualSrq;
struct CqState;

// A key translation's value (the registry stores pointers; the engine owns the values).
struct KeyTranslation {
  std::uint32_t value = 0;
};

using VirtualQpRegistry = ObjectRegistry<VirtualQp, 1 << 16>;
using QpnRegistry = ObjectRegistry<VirtualQp, 1 << 17>;
using CqRegistry = ObjectRegistry<CqState, 1 << 14>;
using SrqRegistry = ObjectRegistry<VirtualSrq, 1 << 12>;
using KeyRegistry = ObjectRegistry<KeyTranslation, 1 << 17>;

namespace datapath_registries {
extern VirtualQpRegistry qps_by_address;
extern QpnRegistry qps_by_qpn;
extern CqRegistry cqs_by_address;
extern SrqRegistry srqs_by_address;
extern KeyRegistry lkeys;  // (device, primary lkey) -> the shadow registration's lkey
extern KeyRegistry rkeys;  // (peer, primary rkey) -> the peer's shadow registration's rkey
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
inline VirtualSrq* find_virtual_srq(const ibv_srq* srq) {
  return datapath_registries::srqs_by_address.find(srq);
}
inline VirtualQp* find_virtual_qp_by_qpn(int device, std::uint32_t qpn) {
  return datapath_registries::qps_by_qpn.find(qpn_registry_key(device, qpn));
}

}  // namespace vf
