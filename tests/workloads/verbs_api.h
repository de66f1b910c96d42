// libibverbs reached exactly as NCCL reaches it (facts file, "How NCCL reaches libibverbs"):
// dlopen of $NCCL_IBVERBS_LIB, else "libibverbs.so", else "libibverbs.so.1" (RTLD_NOW), then
// dlvsym(handle, name, "IBVERBS_1.1") for each control verb. The program is not linked against
// libibverbs; <infiniband/verbs.h> only supplies the types and the static inline data-path calls
// (ibv_post_send/ibv_post_recv/ibv_poll_cq go through ctx->ops, as in NCCL).
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace nccl_pattern {

struct VerbsApi {
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;
  const char* (*event_type_str)(ibv_event_type) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  // The IBVERBS_1.1 symbol has the compat signature; it fills the leading compat part only,
  // which holds every field used here (state, active_mtu, lid, link_layer).
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*fork_init)() = nullptr;
  // Optional, as in NCCL: absent on older libibverbs.
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t, unsigned) = nullptr;  // IBVERBS_1.8
  int (*query_ece)(ibv_qp*, ibv_ece*) = nullptr;                                 // IBVERBS_1.10
  int (*set_ece)(ibv_qp*, ibv_ece*) = nullptr;                                   // IBVERBS_1.10
  // Not in NCCL's list; used only to print readable completion statuses.
  const char* (*wc_status_str)(ibv_wc_status) = nullptr;

  std::string library;  // the name that dlopen accepted
  void* handle = nullptr;

  ibv_mr* register_memory(ibv_pd* pd, void* addr, size_t length, int access) const;
  std::string status_name(ibv_wc_status status) const;
};

// Loads once per process (thread-safe); throws WorkloadError when a required verb is missing.
const VerbsApi& verbs();

}  // namespace nccl_pattern
