// Verbs the shim does not change (names of enums, rate conversions, the fork status and ranges,
// imported device memory, the old kernel-ABI and sysfs helpers), exported so that a lookup through the shim's handle finds them as one through
// libibverbs' does: NCCL's dlopen path (docs/design.md §2b) and NCCL_IBVERBS_LIB (§2c) look verbs
// up in the shim, and the shim has no DT_NEEDED on libibverbs to fall through to (a machine
// without rdma-core must run every program as without the shim: issue 19 item 13). Each calls
// libibverbs' own; one this libibverbs lacks answers as an unknown value or an unsupported verb.
#include <errno.h>
#include <infiniband/verbs.h>

#include "shim/export.h"
#include "shim/real_verbs.h"

using vf::shim::real_verbs;

VF_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  const auto real = real_verbs().ibv_wc_status_str;
  return real != nullptr ? real(status) : "unknown";
}

VF_EXPORT const char* ibv_port_state_str(enum ibv_port_state port_state) {
  const auto real = real_verbs().ibv_port_state_str;
  return real != nullptr ? real(port_state) : "unknown";
}

VF_EXPORT const char* ibv_node_type_str(enum ibv_node_type node_type) {
  const auto real = real_verbs().ibv_node_type_str;
  return real != nullptr ? real(node_type) : "unknown";
}

VF_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
  const auto real = real_verbs().ibv_rate_to_mult;
  return real != nullptr ? real(rate) : -1;
}

VF_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
  const auto real = real_verbs().mult_to_ibv_rate;
  return real != nullptr ? real(mult) : IBV_RATE_MAX;
}

VF_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
  const auto real = real_verbs().ibv_rate_to_mbps;
  return real != nullptr ? real(rate) : -1;
}

VF_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
  const auto real = real_verbs().mbps_to_ibv_rate;
  return real != nullptr ? real(mbps) : IBV_RATE_MAX;
}

VF_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) {
  const auto real = real_verbs().ibv_is_fork_initialized;
  return real != nullptr ? real() : IBV_FORK_DISABLED;
}

VF_EXPORT struct ibv_dm* ibv_import_dm(struct ibv_context* context, uint32_t dm_handle) {
  const auto real = real_verbs().ibv_import_dm;
  if (real == nullptr) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return real(context, dm_handle);
}

VF_EXPORT void ibv_unimport_dm(struct ibv_dm* dm) {
  const auto real = real_verbs().ibv_unimport_dm;
  if (real != nullptr) real(dm);
}

VF_EXPORT int ibv_dontfork_range(void* base, size_t size) {
  const auto real = real_verbs().ibv_dontfork_range;
  return real != nullptr ? real(base, size) : EOPNOTSUPP;
}

VF_EXPORT int ibv_dofork_range(void* base, size_t size) {
  const auto real = real_verbs().ibv_dofork_range;
  return real != nullptr ? real(base, size) : EOPNOTSUPP;
}

VF_EXPORT const char* ibv_get_sysfs_path(void) {
  const auto real = real_verbs().ibv_get_sysfs_path;
  return real != nullptr ? real() : nullptr;
}

VF_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  const auto real = real_verbs().ibv_read_sysfs_file;
  return real != nullptr ? real(dir, file, buf, size) : -1;
}

VF_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec* dst,
                                           struct ib_user_path_rec* src) {
  if (const auto real = real_verbs().ibv_copy_path_rec_from_kern) real(dst, src);
}

VF_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec* dst,
                                         struct ibv_sa_path_rec* src) {
  if (const auto real = real_verbs().ibv_copy_path_rec_to_kern) real(dst, src);
}

VF_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr* dst, struct ib_uverbs_qp_attr* src) {
  if (const auto real = real_verbs().ibv_copy_qp_attr_from_kern) real(dst, src);
}

VF_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr* dst, struct ib_uverbs_ah_attr* src) {
  if (const auto real = real_verbs().ibv_copy_ah_attr_from_kern) real(dst, src);
}
