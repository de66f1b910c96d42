// The verbs the failover engine calls, as a table of function pointers. In the shim they are the
// real libibverbs functions (the shim's own exports would re-enter its hooks); in unit tests they
// are whatever libibverbs the test links (the fake fabric). The engine never names a verb directly.
#pragma once

#include <infiniband/verbs.h>

namespace vf {

struct VerbsApi {
  ibv_device** (*get_device_list)(int* count) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  // The GID's type (IBV_GID_TYPE_IB, _ROCE_V1, _ROCE_V2) at an index, 0 or an errno; nullptr
  // where libibverbs has no ibv_query_gid_ex (before rdma-core 32): types unknown. A NIC with
  // RoCE v1 and v2 lists every address twice, once per type, the v1 entry first.
  int (*query_gid_type)(ibv_context* context, uint8_t port, int index, int* type) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr_iova2)(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                          unsigned int access) = nullptr;
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context,
                       ibv_comp_channel* channel, int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*resize_cq)(ibv_cq* cq, int cqe) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*query_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) = nullptr;
  // ECE (rdma-core >= 30); nullptr in an older libibverbs: no ECE to carry to the standby.
  int (*query_ece)(ibv_qp* qp, ibv_ece* ece) = nullptr;
  int (*set_ece)(ibv_qp* qp, ibv_ece* ece) = nullptr;
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* attr) = nullptr;
  int (*modify_srq)(ibv_srq* srq, ibv_srq_attr* attr, int mask) = nullptr;
  int (*query_srq)(ibv_srq* srq, ibv_srq_attr* attr) = nullptr;
  int (*destroy_srq)(ibv_srq* srq) = nullptr;
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;
  const char* (*event_type_str)(ibv_event_type event) = nullptr;
  // The provider's data-path functions of a context the application opened (the shim replaced
  // the published ones with its hooks); for the engine's own contexts they are the published ones.
  const ibv_context_ops* (*provider_ops)(ibv_context* context) = nullptr;
};

}  // namespace vf
