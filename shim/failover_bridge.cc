// Connects the failover engine (core/) to the loader side: the real libibverbs functions it
// must call (never the shim's own exports, which would re-enter the hooks), and the provider
// functions of the application's contexts that the shim has replaced.
#include "shim/failover_bridge.h"

#include <errno.h>

#include "core/failover_engine.h"
#include "shim/object_records.h"
#include "shim/real_verbs.h"
#include "shim/shim_state.h"

#undef ibv_reg_mr

namespace vf::shim {
namespace {

const ibv_context_ops* provider_ops(ibv_context* context) {
  const ContextRecord* record = context_records().find(context);
  return record != nullptr ? &record->ops : &context->ops;
}

// libibverbs' inline ibv_query_port: the context's own query_port (the engine's contexts are its
// own, not the application's whose functions the shim replaced), as port_monitor.cc asks.
int inline_query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  return ibv_query_port(context, port, attr);
}

int real_query_gid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  return real_verbs().ibv_query_gid(context, port, index, gid);
}

int real_query_gid_type(ibv_context* context, uint8_t port, int index, int* type) {
  if (real_verbs()._ibv_query_gid_ex == nullptr) return EOPNOTSUPP;
  ibv_gid_entry entry{};
  const int result = real_verbs()._ibv_query_gid_ex(context, port, static_cast<uint32_t>(index),
                                                    &entry, 0, sizeof entry);
  if (result == 0) *type = static_cast<int>(entry.gid_type);
  return result;
}

ibv_mr* real_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                          unsigned int access) {
  if (real_verbs().ibv_reg_mr_iova2 != nullptr) {
    return real_verbs().ibv_reg_mr_iova2(pd, addr, length, iova, access);
  }
  if (iova != reinterpret_cast<uintptr_t>(addr)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return real_verbs().ibv_reg_mr(pd, addr, length,
                                 static_cast<int>(access & ~IBV_ACCESS_OPTIONAL_RANGE));
}

}  // namespace

void configure_failover(const Config& config) {
  VerbsApi verbs;
  const RealVerbs& real = real_verbs();
  verbs.get_device_list = real.ibv_get_device_list;
  verbs.free_device_list = real.ibv_free_device_list;
  verbs.open_device = real.ibv_open_device;
  verbs.query_device = real.ibv_query_device;
  verbs.query_port = inline_query_port;
  verbs.query_gid = real_query_gid;
  verbs.query_gid_type = real_query_gid_type;
  verbs.alloc_pd = real.ibv_alloc_pd;
  verbs.dealloc_pd = real.ibv_dealloc_pd;
  verbs.reg_mr_iova2 = real_reg_mr_iova2;
  verbs.reg_dmabuf_mr = real.ibv_reg_dmabuf_mr;
  verbs.dereg_mr = real.ibv_dereg_mr;
  verbs.create_comp_channel = real.ibv_create_comp_channel;
  verbs.destroy_comp_channel = real.ibv_destroy_comp_channel;
  verbs.create_cq = real.ibv_create_cq;
  verbs.destroy_cq = real.ibv_destroy_cq;
  verbs.resize_cq = real.ibv_resize_cq;
  verbs.get_cq_event = real.ibv_get_cq_event;
  verbs.ack_cq_events = real.ibv_ack_cq_events;
  verbs.create_qp = real.ibv_create_qp;
  verbs.modify_qp = real.ibv_modify_qp;
  verbs.destroy_qp = real.ibv_destroy_qp;
  verbs.query_qp = real.ibv_query_qp;
  verbs.query_ece = real.ibv_query_ece;
  verbs.set_ece = real.ibv_set_ece;
  verbs.create_srq = real.ibv_create_srq;
  verbs.modify_srq = real.ibv_modify_srq;
  verbs.query_srq = real.ibv_query_srq;
  verbs.destroy_srq = real.ibv_destroy_srq;
  verbs.get_async_event = real.ibv_get_async_event;
  verbs.ack_async_event = real.ibv_ack_async_event;
  verbs.event_type_str = real.ibv_event_type_str;
  verbs.provider_ops = provider_ops;
  FailoverEngine::instance().configure(config, verbs, program_invocation_short_name);
}

}  // namespace vf::shim
