// The single table of the real libibverbs functions the hooks forward to.
//
// Why a handle and not RTLD_NEXT: the shim is reached three ways (LD_PRELOAD, NCCL's dlopen that
// the dlopen hook redirects to the shim, and NCCL_IBVERBS_LIB naming the shim). RTLD_NEXT only
// means "the real library" in the first; a lookup through libibverbs' own handle means it in all
// three, and asks for the exact version node (IBVERBS_1.1 and not the old 1.0 ABI).
#pragma once

#include <infiniband/verbs.h>

// Newer rdma-core only (IBVERBS_1.16); older headers (Debian 12 ships v44) do not declare it.
extern "C" int ibv_query_port_speed(struct ibv_context* context, uint32_t port_num,
                                    uint64_t* port_speed);

// Exported by libibverbs but declared only in its driver and marshalling headers (or nowhere any
// more): the shim passes them on (utility_hooks.cc) so that a lookup through its handle finds
// every public symbol libibverbs has.
extern "C" {
struct ibv_sa_path_rec;
struct ib_user_path_rec;
struct ib_uverbs_qp_attr;
struct ib_uverbs_ah_attr;
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec* dst, struct ib_user_path_rec* src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec* dst, struct ibv_sa_path_rec* src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr* dst, struct ib_uverbs_qp_attr* src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr* dst, struct ib_uverbs_ah_attr* src);
const char* ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);
}

// X(name, version): every verb the shim exports, with the version node libibverbs gives it.
#define VF_FOR_EACH_HOOKED_VERB(X)            \
  X(ibv_create_comp_channel, "IBVERBS_1.0")   \
  X(ibv_destroy_comp_channel, "IBVERBS_1.0")  \
  X(ibv_get_device_list, "IBVERBS_1.1")       \
  X(ibv_free_device_list, "IBVERBS_1.1")      \
  X(ibv_get_device_name, "IBVERBS_1.1")       \
  X(ibv_get_device_guid, "IBVERBS_1.1")       \
  X(ibv_open_device, "IBVERBS_1.1")           \
  X(ibv_close_device, "IBVERBS_1.1")          \
  X(ibv_get_async_event, "IBVERBS_1.1")       \
  X(ibv_ack_async_event, "IBVERBS_1.1")       \
  X(ibv_event_type_str, "IBVERBS_1.1")        \
  X(ibv_query_device, "IBVERBS_1.1")          \
  X(ibv_query_port, "IBVERBS_1.1")            \
  X(ibv_query_gid, "IBVERBS_1.1")             \
  X(ibv_query_pkey, "IBVERBS_1.1")            \
  X(ibv_alloc_pd, "IBVERBS_1.1")              \
  X(ibv_dealloc_pd, "IBVERBS_1.1")            \
  X(ibv_reg_mr, "IBVERBS_1.1")                \
  X(ibv_rereg_mr, "IBVERBS_1.1")              \
  X(ibv_dereg_mr, "IBVERBS_1.1")              \
  X(ibv_create_cq, "IBVERBS_1.1")             \
  X(ibv_resize_cq, "IBVERBS_1.1")             \
  X(ibv_destroy_cq, "IBVERBS_1.1")            \
  X(ibv_get_cq_event, "IBVERBS_1.1")          \
  X(ibv_ack_cq_events, "IBVERBS_1.1")         \
  X(ibv_create_srq, "IBVERBS_1.1")            \
  X(ibv_modify_srq, "IBVERBS_1.1")            \
  X(ibv_query_srq, "IBVERBS_1.1")             \
  X(ibv_destroy_srq, "IBVERBS_1.1")           \
  X(ibv_create_qp, "IBVERBS_1.1")             \
  X(ibv_query_qp, "IBVERBS_1.1")              \
  X(ibv_modify_qp, "IBVERBS_1.1")             \
  X(ibv_destroy_qp, "IBVERBS_1.1")            \
  X(ibv_create_ah, "IBVERBS_1.1")             \
  X(ibv_destroy_ah, "IBVERBS_1.1")            \
  X(ibv_init_ah_from_wc, "IBVERBS_1.1")       \
  X(ibv_create_ah_from_wc, "IBVERBS_1.1")     \
  X(ibv_attach_mcast, "IBVERBS_1.1")          \
  X(ibv_detach_mcast, "IBVERBS_1.1")          \
  X(ibv_resolve_eth_l2_from_gid, "IBVERBS_1.1") \
  X(ibv_fork_init, "IBVERBS_1.1")             \
  X(ibv_wc_status_str, "IBVERBS_1.1")         \
  X(ibv_port_state_str, "IBVERBS_1.1")        \
  X(ibv_node_type_str, "IBVERBS_1.1")         \
  X(ibv_rate_to_mult, "IBVERBS_1.0")          \
  X(ibv_copy_path_rec_from_kern, "IBVERBS_1.0") \
  X(ibv_copy_path_rec_to_kern, "IBVERBS_1.0") \
  X(ibv_copy_qp_attr_from_kern, "IBVERBS_1.0") \
  X(ibv_get_sysfs_path, "IBVERBS_1.0")        \
  X(ibv_read_sysfs_file, "IBVERBS_1.0")       \
  X(ibv_copy_ah_attr_from_kern, "IBVERBS_1.1") \
  X(ibv_dontfork_range, "IBVERBS_1.1")        \
  X(ibv_dofork_range, "IBVERBS_1.1")          \
  X(mult_to_ibv_rate, "IBVERBS_1.0")          \
  X(ibv_rate_to_mbps, "IBVERBS_1.1")          \
  X(mbps_to_ibv_rate, "IBVERBS_1.1")          \
  X(ibv_get_pkey_index, "IBVERBS_1.5")        \
  X(ibv_qp_to_qp_ex, "IBVERBS_1.6")           \
  X(ibv_reg_mr_iova, "IBVERBS_1.7")           \
  X(ibv_reg_mr_iova2, "IBVERBS_1.8")          \
  X(ibv_get_device_index, "IBVERBS_1.9")      \
  X(ibv_query_ece, "IBVERBS_1.10")            \
  X(ibv_set_ece, "IBVERBS_1.10")              \
  X(ibv_import_device, "IBVERBS_1.10")        \
  X(ibv_import_pd, "IBVERBS_1.10")            \
  X(ibv_unimport_pd, "IBVERBS_1.10")          \
  X(ibv_import_mr, "IBVERBS_1.10")            \
  X(ibv_unimport_mr, "IBVERBS_1.10")          \
  X(_ibv_query_gid_ex, "IBVERBS_1.11")        \
  X(_ibv_query_gid_table, "IBVERBS_1.11")     \
  X(ibv_reg_dmabuf_mr, "IBVERBS_1.12")        \
  X(ibv_is_fork_initialized, "IBVERBS_1.13")  \
  X(ibv_import_dm, "IBVERBS_1.13")            \
  X(ibv_unimport_dm, "IBVERBS_1.13")          \
  X(ibv_query_qp_data_in_order, "IBVERBS_1.14") \
  X(ibv_query_port_speed, "IBVERBS_1.16")

namespace vf::shim {

struct RealVerbs {
#define VF_DECLARE_REAL(name, version) decltype(&::name) name = nullptr;
  VF_FOR_EACH_HOOKED_VERB(VF_DECLARE_REAL)
#undef VF_DECLARE_REAL
  void* handle = nullptr;  // libibverbs.so.1 as the dynamic loader resolved it for the shim
};

// Resolved on first use (a hook can run before the shim's constructor). A verb this libibverbs
// does not have stays nullptr; its hook then fails the way libibverbs fails an unsupported verb.
const RealVerbs& real_verbs();

}  // namespace vf::shim
