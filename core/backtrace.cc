#define UNW_LOCAL_ONLY
#include "core/backtrace.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <libunwind.h>
#include <string.h>
#include <unistd.h>

#include <mutex>

namespace vf {
namespace {

// libunwind is loaded on first use, RTLD_LOCAL, and never linked: its shared library exports the
// _Unwind_* symbols of the C++ exception ABI, and as a dependency of a preloaded library it would
// come before libgcc_s in every process and take over every C++ exception (seen: libstdc++'s
// _Unwind_RaiseException bound to libunwind.so.8 under LD_PRELOAD). Debian ships libunwind.a
// without -fPIC, so static linking is not an option either.
struct UnwindApi {
  int (*getcontext)(unw_context_t*) = nullptr;
  int (*init_local)(unw_cursor_t*, unw_context_t*) = nullptr;
  int (*step)(unw_cursor_t*) = nullptr;
  int (*get_reg)(unw_cursor_t*, unw_regnum_t, unw_word_t*) = nullptr;
  int (*get_proc_name)(unw_cursor_t*, char*, size_t, unw_word_t*) = nullptr;
  bool usable() const { return getcontext && init_local && step && get_reg && get_proc_name; }
};

UnwindApi load_unwind_api() {
  UnwindApi api;
  void* handle = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return api;
  // The names behind libunwind.h's unw_* macros for local unwinding on x86_64.
  api.getcontext = reinterpret_cast<decltype(api.getcontext)>(dlsym(handle, "_Ux86_64_getcontext"));
  api.init_local = reinterpret_cast<decltype(api.init_local)>(dlsym(handle, "_ULx86_64_init_local"));
  api.step = reinterpret_cast<decltype(api.step)>(dlsym(handle, "_ULx86_64_step"));
  api.get_reg = reinterpret_cast<decltype(api.get_reg)>(dlsym(handle, "_ULx86_64_get_reg"));
  api.get_proc_name =
      reinterpret_cast<decltype(api.get_proc_name)>(dlsym(handle, "_ULx86_64_get_proc_name"));
  return api;
}

const UnwindApi& unwind_api() {
  static const UnwindApi api = load_unwind_api();
  return api;
}

const char* basename_of(const char* path) {
  if (path == nullptr) return "?";
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// The shim's frames say nothing to the user; a stack starts at the first frame outside it.
bool is_own_frame(std::uintptr_t ip) {
  Dl_info self{};
  Dl_info here{};
  if (dladdr(reinterpret_cast<void*>(&is_own_frame), &self) == 0) return false;
  if (dladdr(reinterpret_cast<void*>(ip), &here) == 0) return false;
  return self.dli_fbase == here.dli_fbase;
}

// The shim's frames between a hook and its caller: a few, never dozens.
constexpr int kMaxOwnFrames = 32;

// The calling thread's stack, walked by libunwind from a cursor its caller set up (the context
// must be taken in a frame that stays live for the whole walk).
class LibunwindWalker final : public FrameWalker {
 public:
  LibunwindWalker(const UnwindApi& api, unw_cursor_t& cursor) : api_(api), cursor_(cursor) {}
  bool next(std::uintptr_t* ip) override {
    if (api_.step(&cursor_) <= 0) return false;
    unw_word_t word = 0;
    api_.get_reg(&cursor_, UNW_REG_IP, &word);
    *ip = static_cast<std::uintptr_t>(word);
    return true;
  }
  bool symbol(char* name, std::size_t size, std::uintptr_t* offset) override {
    unw_word_t word = 0;
    if (api_.get_proc_name(&cursor_, name, size, &word) != 0) return false;
    *offset = static_cast<std::uintptr_t>(word);
    return true;
  }

 private:
  const UnwindApi& api_;
  unw_cursor_t& cursor_;
};

}  // namespace

bool backtraces_available() { return unwind_api().usable(); }

std::string describe_caller_frames(FrameWalker& walker, int max_frames) {
  std::string out;
  int frames = 0;
  // Every step counts against the bound, the shim's own skipped frames too.
  for (int steps = 0; frames < max_frames && steps < max_frames + kMaxOwnFrames; ++steps) {
    std::uintptr_t ip = 0;
    if (!walker.next(&ip)) break;
    if (is_own_frame(ip)) continue;
    char name[256];
    std::uintptr_t offset = 0;
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(ip), &info);
    if (walker.symbol(name, sizeof(name), &offset)) {
      out += fmt::format(" <- {}+{:#x} ({})", name, offset, basename_of(info.dli_fname));
    } else {
      out += fmt::format(" <- {:#x} ({})", ip, basename_of(info.dli_fname));
    }
    ++frames;
  }
  return out;
}

std::string caller_stack(int max_frames) {
  const UnwindApi& api = unwind_api();
  if (!api.usable()) return " (libunwind.so.8 not available)";
  unw_context_t context;
  unw_cursor_t cursor;
  if (api.getcontext(&context) != 0 || api.init_local(&cursor, &context) != 0) return " <- ?";
  LibunwindWalker walker(api, cursor);
  return describe_caller_frames(walker, max_frames);
}

void write_stack_to_fd(int fd, int max_frames) {
  const UnwindApi& api = unwind_api();  // loaded before any signal by backtraces_available()
  if (!api.usable()) return;
  unw_context_t context;
  unw_cursor_t cursor;
  if (api.getcontext(&context) != 0 || api.init_local(&cursor, &context) != 0) return;
  for (int frame = 0; frame < max_frames && api.step(&cursor) > 0; ++frame) {
    unw_word_t ip = 0;
    api.get_reg(&cursor, UNW_REG_IP, &ip);
    char name[256] = "?";
    unw_word_t offset = 0;
    api.get_proc_name(&cursor, name, sizeof(name), &offset);
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(ip), &info);
    char line[512];
    const auto result = fmt::format_to_n(line, sizeof(line) - 1, "  #{} {:#x} {}+{:#x} ({})\n",
                                         frame, ip, name, offset, basename_of(info.dli_fname));
    ssize_t ignored = ::write(fd, line, result.size);
    (void)ignored;
  }
}

}  // namespace vf
