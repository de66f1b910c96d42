// Providers' direct-verbs CQ creation: mlx5dv_create_cq (libmlx5, UCX's mlx5 transports) and
// efadv_create_cq (libefa). Like ibv_create_cq_ex they hand attr->channel->fd to the kernel, so
// a completion channel whose fd the shim replaced (core/failover/channel_wakeup.h) must reach
// them with its real event file, or the kernel refuses the fd (EBADF) and a program that worked
// without the shim fails. Only the channel is translated: the CQs stay the provider's own and
// unmanaged, as before.
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

#include "core/failover_engine.h"
#include "shim/dl_hooks.h"
#include "shim/export.h"
#include "shim/verbs_hooks/real_channel.h"
#include "shim/shim_state.h"
#include "shim/trace.h"

using vf::shim::describe_context;
using vf::shim::intercept;

namespace {

// The provider's function: from its library if loaded (the caller links it, possibly
// RTLD_LOCAL, where RTLD_NEXT cannot see it), else the next definition. Looked up once.
template <typename Fn>
Fn provider_function(std::atomic<Fn>& cache, const char* library, const char* name,
                     const char* version) {
  Fn fn = cache.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  void* symbol = nullptr;
  if (void* handle = vf::shim::real_dlopen()(library, RTLD_LAZY | RTLD_NOLOAD)) {
    symbol = dlvsym(handle, name, version);  // the handle's reference is kept with the pointer
  }
  if (symbol == nullptr) symbol = dlvsym(RTLD_NEXT, name, version);
  fn = reinterpret_cast<Fn>(symbol);
  cache.store(fn, std::memory_order_release);
  return fn;
}

using Mlx5dvCreateCq = ibv_cq_ex* (*)(ibv_context*, ibv_cq_init_attr_ex*, void*);
using EfadvCreateCq = ibv_cq_ex* (*)(ibv_context*, ibv_cq_init_attr_ex*, void*, std::uint32_t);
std::atomic<Mlx5dvCreateCq> g_mlx5dv_create_cq{nullptr};
std::atomic<EfadvCreateCq> g_efadv_create_cq{nullptr};

}  // namespace

// The provider-specific attribute structs are passed through untouched (void*: the shim does
// not depend on the providers' headers).
VF_EXPORT ibv_cq_ex* mlx5dv_create_cq(ibv_context* context, ibv_cq_init_attr_ex* cq_attr,
                                      void* mlx5_cq_attr) {
  return intercept("mlx5dv_create_cq", VF_ARGS("{}", describe_context(context)), [&] {
    const Mlx5dvCreateCq real =
        provider_function(g_mlx5dv_create_cq, "libmlx5.so.1", "mlx5dv_create_cq", "MLX5_1.1");
    if (real == nullptr) {
      errno = EOPNOTSUPP;
      return static_cast<ibv_cq_ex*>(nullptr);
    }
    return vf::shim::create_with_real_channel(cq_attr, [&](ibv_cq_init_attr_ex* attr) {
      return real(context, attr, mlx5_cq_attr);
    });
  });
}

VF_EXPORT ibv_cq_ex* efadv_create_cq(ibv_context* context, ibv_cq_init_attr_ex* attr_ex,
                                     void* efa_attr, std::uint32_t inlen) {
  return intercept("efadv_create_cq", VF_ARGS("{}", describe_context(context)), [&] {
    const EfadvCreateCq real =
        provider_function(g_efadv_create_cq, "libefa.so.1", "efadv_create_cq", "EFA_1.2");
    if (real == nullptr) {
      errno = EOPNOTSUPP;
      return static_cast<ibv_cq_ex*>(nullptr);
    }
    return vf::shim::create_with_real_channel(attr_ex, [&](ibv_cq_init_attr_ex* attr) {
      return real(context, attr, efa_attr, inlen);
    });
  });
}
