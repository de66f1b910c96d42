// NCCL's way into libibverbs: dlopen("libibverbs.so[.1]") then dlvsym(handle, name,
// "IBVERBS_1.1"). A handle lookup never searches LD_PRELOAD objects, so a preloaded shim is
// invisible to it; the dlopen hook answers such a dlopen with the shim's own handle instead.
// dlvsym on that handle finds the shim's hooks first and, for verbs the shim does not wrap,
// falls through to libibverbs, which is the shim's DT_NEEDED dependency.
#pragma once

#include <string_view>

namespace vf::shim {

using DlopenFn = void* (*)(const char*, int);
// glibc's dlopen, resolved lazily; the shim's own dlopen calls go through it, never through the
// hook.
DlopenFn real_dlopen();

// True for "libibverbs.so", "libibverbs.so.1", "libibverbs.so.1.14.44.0" and such paths.
bool names_libibverbs(std::string_view file);

}  // namespace vf::shim
