// FAKE libibverbs (verbs-failover test double) — small verbs with trivial or "not supported"
// behaviour: fork support, ECE, address handles, dmabuf MRs, imports, L2 resolution.
// Unimplemented calls fail cleanly (NULL + errno=EOPNOTSUPP, or return EOPNOTSUPP).
#include <cerrno>
#include <cstring>

#include "internal.h"

using namespace fake_verbs;

namespace {
bool fork_initialized = false;  // nothing to do for fork in-process; just remember the call
}

FAKE_EXPORT int ibv_fork_init(void) {
  fork_initialized = true;
  return 0;
}

FAKE_EXPORT ibv_fork_status ibv_is_fork_initialized(void) {
  return fork_initialized ? IBV_FORK_ENABLED : IBV_FORK_DISABLED;
}

FAKE_EXPORT int ibv_dontfork_range(void*, size_t) {
  return 0;
}
FAKE_EXPORT int ibv_dofork_range(void*, size_t) {
  return 0;
}

// ECE (enhanced connection establishment): vendor kEceVendorId with two option bits. A QP reports
// the options it will use; ibv_set_ece takes a subset of the supported ones, and only before RTR
// (they are applied at the modify stages, ibv_set_ece(3)); a RESET restores the defaults.
FAKE_EXPORT int ibv_query_ece(ibv_qp* ibqp, ibv_ece* ece) {
  auto lock = fabric_lock();
  std::memset(ece, 0, sizeof *ece);
  ece->vendor_id = kEceVendorId;
  ece->options = to_qp(ibqp)->ece_options;
  return 0;
}

FAKE_EXPORT int ibv_set_ece(ibv_qp* ibqp, ibv_ece* ece) {
  auto lock = fabric_lock();
  if (ece == nullptr || ece->comp_mask != 0 || ece->vendor_id != kEceVendorId ||
      (ece->options & ~kEceSupportedOptions) != 0) {
    return EINVAL;
  }
  Qp* qp = to_qp(ibqp);
  if (qp->attr.qp_state != IBV_QPS_RESET && qp->attr.qp_state != IBV_QPS_INIT) return EINVAL;
  qp->ece_options = ece->options;
  return 0;
}

FAKE_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  auto lock = fabric_lock();
  if (attr->port_num != 1 || !attr->is_global || attr->grh.sgid_index >= kGidTableLen) {
    errno = EINVAL;  // RoCE address handles need a GRH
    return nullptr;
  }
  if (gid_is_empty(to_pd(pd)->ctx->device->gids[attr->grh.sgid_index])) {
    errno = ENODATA;  // as ibv_modify_qp: no valid GID in that slot
    return nullptr;
  }
  auto* shell = new AhShell();
  shell->ah.context = pd->context;
  shell->ah.pd = pd;
  shell->attr = *attr;
  ++to_pd(pd)->refs;
  return &shell->ah;
}

FAKE_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  auto lock = fabric_lock();
  --to_pd(ah->pd)->refs;
  delete reinterpret_cast<AhShell*>(ah);
  return 0;
}

// UD address-handle-from-completion helpers: RC-only fake.
FAKE_EXPORT int ibv_init_ah_from_wc(ibv_context*, uint8_t, ibv_wc*, ibv_grh*, ibv_ah_attr*) {
  return EOPNOTSUPP;
}
FAKE_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd*, ibv_wc*, ibv_grh*, uint8_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}

// Fake NICs have no netdev; report a fixed locally administered MAC derived from the GID.
FAKE_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr* attr, uint8_t eth_mac[6],
                                            uint16_t* vid) {
  const uint8_t* g = attr->grh.dgid.raw;
  uint8_t mac[6] = {0x02, 0xfa, 0x4e, g[13], g[14], g[15]};
  std::memcpy(eth_mac, mac, 6);
  if (vid != nullptr) *vid = 0xffff;  // no VLAN
  return 0;
}

FAKE_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}

FAKE_EXPORT int ibv_attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) {
  return EOPNOTSUPP;
}
FAKE_EXPORT int ibv_detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) {
  return EOPNOTSUPP;
}

FAKE_EXPORT ibv_context* ibv_import_device(int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FAKE_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FAKE_EXPORT void ibv_unimport_pd(ibv_pd*) {}
FAKE_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FAKE_EXPORT void ibv_unimport_mr(ibv_mr*) {}
FAKE_EXPORT ibv_dm* ibv_import_dm(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FAKE_EXPORT void ibv_unimport_dm(ibv_dm*) {}

// The fake delivers every message whole and in order, which is what "data in order" promises.
FAKE_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
  return 1;
}

// sysfs helpers (IBVERBS_1.0): the fake has no sysfs; point nowhere real and fail reads.
FAKE_EXPORT const char* ibv_get_sysfs_path(void) {
  return "/nonexistent/fake_verbs/sys";
}
FAKE_EXPORT int ibv_read_sysfs_file(const char*, const char*, char*, size_t) {
  return -1;
}
