#define UNW_LOCAL_ONLY
#include "core/backtrace.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <libunwind.h>
#include <string.h>
#include <unistd.h>

namespace vf {
namespace {

const char* basename_of(const char* path) {
  if (path == nullptr) return "?";
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// The shim's frames say nothing to the user; a stack starts at the first frame outside it.
bool is_own_frame(unw_word_t ip) {
  Dl_info self{};
  Dl_info here{};
  if (dladdr(reinterpret_cast<void*>(&is_own_frame), &self) == 0) return false;
  if (dladdr(reinterpret_cast<void*>(ip), &here) == 0) return false;
  return self.dli_fbase == here.dli_fbase;
}

}  // namespace

std::string caller_stack(int max_frames) {
  unw_context_t context;
  unw_cursor_t cursor;
  if (unw_getcontext(&context) != 0 || unw_init_local(&cursor, &context) != 0) return " <- ?";
  std::string out;
  int frames = 0;
  while (frames < max_frames && unw_step(&cursor) > 0) {
    unw_word_t ip = 0;
    unw_get_reg(&cursor, UNW_REG_IP, &ip);
    if (is_own_frame(ip)) continue;
    char name[256];
    unw_word_t offset = 0;
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(ip), &info);
    if (unw_get_proc_name(&cursor, name, sizeof(name), &offset) == 0) {
      out += fmt::format(" <- {}+{:#x} ({})", name, offset, basename_of(info.dli_fname));
    } else {
      out += fmt::format(" <- {:#x} ({})", ip, basename_of(info.dli_fname));
    }
    ++frames;
  }
  return out;
}

void write_stack_to_fd(int fd, int max_frames) {
  unw_context_t context;
  unw_cursor_t cursor;
  if (unw_getcontext(&context) != 0 || unw_init_local(&cursor, &context) != 0) return;
  for (int frame = 0; frame < max_frames && unw_step(&cursor) > 0; ++frame) {
    unw_word_t ip = 0;
    unw_get_reg(&cursor, UNW_REG_IP, &ip);
    char name[256] = "?";
    unw_word_t offset = 0;
    unw_get_proc_name(&cursor, name, sizeof(name), &offset);
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
