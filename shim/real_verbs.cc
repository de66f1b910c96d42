#include "shim/real_verbs.h"

#include <dlfcn.h>

#include "core/log.h"
#include "shim/dl_hooks.h"

namespace vf::shim {
namespace {

RealVerbs resolve() {
  RealVerbs table;
  // The shim is DT_NEEDED on libibverbs.so.1, so this finds the loaded copy (or the fake one
  // tests put first on LD_LIBRARY_PATH) without loading anything new.
  table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (table.handle == nullptr) table.handle = real_dlopen()("libibverbs.so.1", RTLD_NOW);
  if (table.handle == nullptr) {
    VF_LOG_ERROR("cannot open libibverbs.so.1 ({}); every verb will fail", dlerror());
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
