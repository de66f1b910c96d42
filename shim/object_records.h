// What the shim remembers about the provider objects it has touched. The application always
// holds the provider's own objects (so every field — qp_num, handle, lkey... — is the provider's
// and any provider function, mlx5dv_* included, can take them); the shim only redirects the
// function pointers a provider publishes (ibv_context.ops, verbs_context, ibv_qp_ex, ibv_cq_ex)
// and keeps the originals here, found again by the object's address.
#pragma once

#include <infiniband/verbs.h>

#include <mutex>

#include "core/object_registry.h"
#include "core/virtual_qp.h"

namespace vf::shim {

struct ContextRecord {
  ibv_context* context = nullptr;
  ibv_context_ops ops{};  // the provider's data-path functions
  // The provider's extended verbs (nullptr where its verbs_context is too short to have them).
  decltype(verbs_context::query_port) query_port = nullptr;
  decltype(verbs_context::query_device_ex) query_device_ex = nullptr;
  decltype(verbs_context::create_qp_ex) create_qp_ex = nullptr;
  decltype(verbs_context::create_cq_ex) create_cq_ex = nullptr;
  decltype(verbs_context::create_srq_ex) create_srq_ex = nullptr;
};

struct QpExRecord {
  ibv_qp_ex original{};  // the provider's wr_* functions
};

struct CqExRecord {
  ibv_cq_ex original{};  // the provider's start_poll/next_poll/end_poll
  // The failover engine manages the CQ (its completions come from both paths): the iterator is
  // served from completions polled through it, kept here between start_poll and end_poll.
  static constexpr int kBatch = 16;
  CqState* failover = nullptr;
  ibv_wc batch[kBatch]{};
  int count = 0;
  int index = 0;         // the completion the iterator exposes (or will, next start_poll)
  bool exposed = false;  // start_poll/next_poll returned it and the application reads it
};

// Limits: a process with more live objects than this runs the excess unmanaged (plain provider
// functions, a warning once), never fails.
inline constexpr std::size_t kMaxContexts = 1024;
inline constexpr std::size_t kMaxExtendedQps = 1 << 16;
inline constexpr std::size_t kMaxExtendedCqs = 1 << 14;

using ContextRegistry = ObjectRegistry<ContextRecord, kMaxContexts>;
using QpExRegistry = ObjectRegistry<QpExRecord, kMaxExtendedQps>;
using CqExRegistry = ObjectRegistry<CqExRecord, kMaxExtendedCqs>;

ContextRegistry& context_records();
QpExRegistry& qp_ex_records();
CqExRegistry& cq_ex_records();

// Creation and destruction of managed objects are serialised, so an address freed by one thread
// and reused by another is never seen with a stale record.
std::mutex& lifecycle_mutex();

// Patches a freshly opened context (ibv_open_device, ibv_import_device) and registers it.
void manage_context(ibv_context* context);
// After a successful ibv_close_device.
void forget_context(ibv_context* context);
// Extended QPs/CQs: patch the wr_* / poll functions the provider published.
// For QPs created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS only: a provider that accepted send ops
// allocated a verbs_qp, so its ibv_qp_ex exists. send_ops_flags say which wr_* members the
// provider filled (a member newer than the runtime rdma-core, like wr_atomic_write before v44,
// is not there at all and must not be written).
void manage_qp_ex(ibv_qp* qp, uint64_t send_ops_flags);
// ibv_qp_ex begins with its ibv_qp, so the QP's address is the key; nothing is dereferenced
// (the QP is already destroyed when this runs).
void forget_qp_ex(ibv_qp* qp);
void manage_cq_ex(ibv_cq_ex* cq);
void forget_cq(ibv_cq* cq);
// Drops the lifecycle lock and the registries' locks across fork() (shim_state's atfork).
void register_records_for_fork();

}  // namespace vf::shim
