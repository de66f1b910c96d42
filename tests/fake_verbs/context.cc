// FAKE libibverbs (verbs-failover test double) — ibv_open_device/ibv_close_device and the async
// event queue. The context is a real struct verbs_context (abi_compat = __VERBS_ABI_IS_EXTENDED,
// sz = sizeof(struct verbs_context)) so the inline "extended" verbs of <infiniband/verbs.h> find
// their function pointers exactly where a real provider would put them.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "internal.h"

using namespace fake_verbs;

namespace fake_verbs {

// Fills only the slots a real provider (mlx5/rxe) fills for the features the fake implements;
// everything else stays NULL so verbs_get_ctx_op() makes the inline wrappers return EOPNOTSUPP.
void fill_context_ops(ContextShell* shell) {
  ibv_context_ops& ops = shell->vctx.context.ops;
  ops.post_send = post_send_op;
  ops.post_recv = post_recv_op;
  ops.post_srq_recv = post_srq_recv_op;
  ops.poll_cq = poll_cq_op;
  ops.req_notify_cq = req_notify_cq_op;
  verbs_context& v = shell->vctx;
  v.query_port = query_port_op;
  v.query_device_ex = query_device_ex_op;
  v.create_qp_ex = create_qp_ex_op;
  v.create_cq_ex = create_cq_ex_op;
  v.create_srq_ex = create_srq_ex_op;
}

}  // namespace fake_verbs

FAKE_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  auto lock = fabric_lock();
  Device* dev = to_device(device);
  auto* ctx = new Context();
  ctx->device = dev;
  ctx->shell.impl = ctx;
  ContextShell* shell = &ctx->shell;
  shell->vctx.sz = sizeof(verbs_context);
  ibv_context& c = shell->vctx.context;
  c.device = device;
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c.num_comp_vectors = 1;
  // Real fds so applications can poll()/fcntl() them: async_fd counts queued async events
  // (semaphore eventfd: one read per event); cmd_fd is a placeholder nothing reads.
  c.async_fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
  c.cmd_fd = eventfd(0, EFD_CLOEXEC);
  if (c.async_fd < 0 || c.cmd_fd < 0) {
    int err = errno;
    if (c.async_fd >= 0) close(c.async_fd);
    if (c.cmd_fd >= 0) close(c.cmd_fd);
    delete ctx;
    errno = err;
    return nullptr;
  }
  pthread_mutex_init(&c.mutex, nullptr);
  fill_context_ops(shell);
  dev->contexts.push_back(ctx);
  fake_log("opened FAKE device %s (host %d rail %d)", device->name, dev->host, dev->rail);
  return &c;
}

FAKE_EXPORT int ibv_close_device(ibv_context* context) {
  auto lock = fabric_lock();
  Context* ctx = to_ctx(context);
  auto& list = ctx->device->contexts;
  list.erase(std::remove(list.begin(), list.end(), ctx), list.end());
  if (ctx->live_objects > 0) {
    // Like the kernel, closing with resources still alive succeeds; the fake keeps the context
    // (and its fds) alive so those objects never point at freed memory or a reused fd.
    fake_log("%s closed with %d live objects: context leaked on purpose", context->device->name,
             ctx->live_objects);
    return 0;
  }
  close(context->async_fd);
  close(context->cmd_fd);
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

// Blocks in read() on async_fd without the fabric lock, so another thread can raise the event.
// With O_NONBLOCK set on async_fd it returns -1/EAGAIN when nothing is queued, like rdma-core.
FAKE_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  uint64_t count;
  if (read(context->async_fd, &count, sizeof count) != sizeof count) return -1;
  auto lock = fabric_lock();
  Context* ctx = to_ctx(context);
  if (ctx->async_events.empty()) {  // cannot happen: one eventfd count per queued event
    errno = EIO;
    return -1;
  }
  *event = ctx->async_events.front();
  ctx->async_events.pop_front();
  ++ctx->async_events_unacked;
  return 0;
}

FAKE_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  (void)event;  // resources are not reference-counted against events in the fake
}
