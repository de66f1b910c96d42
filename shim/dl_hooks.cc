#include "shim/dl_hooks.h"

#include <dlfcn.h>

#include <atomic>

#include "core/log.h"
#include "shim/export.h"
#include "shim/real_verbs.h"
#include "shim/shim_state.h"

namespace vf::shim {
namespace {

std::atomic<DlopenFn> g_real_dlopen{nullptr};

// Our own handle, with a reference of its own, so the caller's dlclose balances it.
void* open_self(int mode) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&open_self), &info) == 0 || info.dli_fname == nullptr) {
    return nullptr;
  }
  return real_dlopen()(info.dli_fname, (mode & RTLD_NOW ? RTLD_NOW : RTLD_LAZY) | RTLD_NOLOAD);
}

// Returns the shim's handle when `file` names libibverbs and the shim is active, else nullptr.
void* redirect_verbs_dlopen(const char* file, int mode) {
  if (file == nullptr || !names_libibverbs(file)) return nullptr;
  ensure_initialized();
  if (!shim_active()) return nullptr;
  // Load (or count a reference to) the real library first, so failures and RTLD_NOLOAD probes
  // answer exactly as they would without the shim.
  void* real = real_dlopen()(file, mode);
  if (real == nullptr) return nullptr;
  void* self = open_self(mode);
  if (self == nullptr) {
    VF_LOG_WARN("dlopen(\"{}\"): cannot open the shim's own handle; verbs reached through this "
                "handle bypass verbs-failover",
                file);
    return real;
  }
  // libibverbs stays loaded: the shim's table of real verbs holds a reference of its own, taken
  // when the shim started (real_verbs.cc), never given back. A library the shim could not load
  // then (named by a path outside the loader's search) is the program's own: not redirected.
  if (real_verbs().handle == nullptr) return real;
  dlclose(real);
  VF_LOG_DEBUG("dlopen(\"{}\") answered with the shim's handle", file);
  return self;
}

}  // namespace

DlopenFn real_dlopen() {
  DlopenFn fn = g_real_dlopen.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<DlopenFn>(dlvsym(RTLD_NEXT, "dlopen", "GLIBC_2.34"));
    if (fn == nullptr) fn = reinterpret_cast<DlopenFn>(dlvsym(RTLD_NEXT, "dlopen", "GLIBC_2.2.5"));
    g_real_dlopen.store(fn, std::memory_order_release);
  }
  return fn;
}

bool names_libibverbs(std::string_view file) {
  const auto slash = file.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? file : file.substr(slash + 1);
  constexpr std::string_view kName = "libibverbs.so";
  if (base.substr(0, kName.size()) != kName) return false;
  return base.size() == kName.size() || base[kName.size()] == '.';
}

}  // namespace vf::shim

// glibc's dlopen finds the caller's RUNPATH and $ORIGIN from its return address. So that every
// dlopen the shim does not redirect resolves exactly as it would without the shim, the hook ends
// in a sibling call: real dlopen then sees the application's return address, not the shim's.
// The function is compiled at -O2 whatever the build type, because at -O0 GCC emits no sibling
// calls (seen: a Debug build broke RUNPATH lookups). tests/preload checks this with a library
// found only through its caller's RUNPATH.
extern "C" __attribute__((visibility("default"), optimize("O2"))) void*
vf_dlopen_hook(const char* file, int mode) {
  if (void* redirected = vf::shim::redirect_verbs_dlopen(file, mode)) return redirected;
  return vf::shim::real_dlopen()(file, mode);
}
extern "C" __attribute__((visibility("default"), alias("vf_dlopen_hook"))) void*
vf_dlopen_hook_compat(const char* file, int mode);

// Programs built against glibc >= 2.34 reference dlopen@GLIBC_2.34, older ones
// dlopen@GLIBC_2.2.5; the shim answers both (see the version script).
__asm__(".symver vf_dlopen_hook, dlopen@@GLIBC_2.34");
__asm__(".symver vf_dlopen_hook_compat, dlopen@GLIBC_2.2.5");
