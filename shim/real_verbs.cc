#include "shim/real_verbs.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "core/log.h"
#include "shim/dl_hooks.h"

namespace vf::shim {
namespace {

void resolve_from(RealVerbs& table) {
#define VF_RESOLVE_REAL(name, version) \
  table.name = reinterpret_cast<decltype(table.name)>(dlvsym(table.handle, #name, version));
  VF_FOR_EACH_HOOKED_VERB(VF_RESOLVE_REAL)
#undef VF_RESOLVE_REAL
}

RealVerbs resolve() {
  RealVerbs table;
  // The copy the program loaded (or the fake one tests put first on LD_LIBRARY_PATH), else the one
  // the loader finds, loaded as the DT_NEEDED dependency of a preloaded shim would have been:
  // into the global scope, where a library dlopened later may look for its symbols (when the shim
  // is itself dlopened, NCCL_IBVERBS_LIB, that is wider than a dependency's local scope).
  table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (table.handle == nullptr) {
    table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  }
  if (table.handle == nullptr) {
    // No rdma-core here (a job-wide LD_PRELOAD reaches every process): nothing can call a verb
    // without libibverbs, so the program runs as without the shim (issue 19 item 13).
    const char* why = dlerror();
    VF_LOG_INFO("libibverbs.so.1 cannot be loaded ({}): verbs-failover stays idle; the program "
                "runs as without it",
                why != nullptr ? why : "no reason given");
    return table;
  }
  resolve_from(table);
  return table;
}

}  // namespace

const RealVerbs& real_verbs() {
  static const RealVerbs table = resolve();
  if (table.handle != nullptr) return table;
  // None when the shim started, but the program may have loaded one since by a path outside the
  // loader's search: found by its soname. libibverbs' and librdmacm's own calls of exported verbs
  // reach the shim's (ibv_get_sysfs_path, ibv_dontfork_range...), and must reach that copy. Kept
  // once found, never freed (hooks hold its functions); the shim itself stays inactive.
  static std::atomic<const RealVerbs*> late{nullptr};
  if (const RealVerbs* found = late.load(std::memory_order_acquire)) return *found;
  static std::mutex late_mutex;
  std::lock_guard lock(late_mutex);
  if (const RealVerbs* found = late.load(std::memory_order_relaxed)) return *found;
  void* handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return table;
  auto* found = new RealVerbs;
  found->handle = handle;
  resolve_from(*found);
  late.store(found, std::memory_order_release);
  return *found;
}

}  // namespace vf::shim
