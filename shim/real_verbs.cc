#include "shim/real_verbs.h"

#include <dlfcn.h>

#include "core/log.h"
#include "shim/dl_hooks.h"

namespace vf::shim {
namespace {

RealVerbs resolve() {
  RealVerbs table;
  // The copy the program loaded (or the fake one tests put first on LD_LIBRARY_PATH), else the one
  // the loader finds, loaded as the DT_NEEDED dependency of a preloaded shim would have been:
  // into the global scope, where a library dlopened later may look for its symbols (when the shim
  // is itself dlopened, NCCL_IBVERBS_LIB, that is wider than a dependency's local scope).
  table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (table.handle == nullptr) table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (table.handle == nullptr) {
    // No rdma-core here (a job-wide LD_PRELOAD reaches every process): nothing can call a verb
    // without libibverbs, so the program runs as without the shim (issue 19 item 13).
    const char* why = dlerror();
    VF_LOG_INFO("libibverbs.so.1 cannot be loaded ({}): verbs-failover stays idle; the program "
                "runs as without it",
                why != nullptr ? why : "no reason given");
    return table;
  }
#define VF_RESOLVE_REAL(name, version) \
  table.name = reinterpret_cast<decltype(table.name)>(dlvsym(table.handle, #name, version));
  VF_FOR_EACH_HOOKED_VERB(VF_RESOLVE_REAL)
#undef VF_RESOLVE_REAL
  return table;
}

}  // namespace

const RealVerbs& real_verbs() {
  static const RealVerbs table = resolve();
  return table;
}

}  // namespace vf::shim
