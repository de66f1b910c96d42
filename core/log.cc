#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace vf {
namespace {

std::atomic<int> g_fd{STDERR_FILENO};
std::mutex g_configure_mutex;

// Not cached: a thread_local cache would keep the parent's tid in a forked child. Logging is off
// the data path, so the syscall costs nothing that matters.
int current_tid() { return static_cast<int>(::syscall(SYS_gettid)); }

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // a log sink that fails must never take the application down with it
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

namespace log_detail {

void write_line(LogLevel level, std::string_view message) {
  const int saved_errno = errno;  // logging sits between a verb and the errno its caller reads
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "verbs-failover[{}:{}] {}: {}\n", ::getpid(),
                 current_tid(), log_level_name(level), message);
  write_all(g_fd.load(std::memory_order_relaxed), line.data(), line.size());
  errno = saved_errno;
}

}  // namespace log_detail

std::string log_configure(LogLevel level, const std::string& file) {
  std::lock_guard lock(g_configure_mutex);
  log_detail::g_level.store(level, std::memory_order_relaxed);
  if (file.empty()) return {};
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return fmt::format(
        "VERBS_FAILOVER_LOG_FILE='{}' cannot be opened ({}); accepted values: a writable file "
        "path (%p = pid); logging to stderr",
        file, ::strerror(errno));
  }
  const int old = g_fd.exchange(fd);
  if (old != STDERR_FILENO) ::close(old);
  return {};
}

LogLevel log_level() { return log_detail::g_level.load(std::memory_order_relaxed); }

int log_fd() { return g_fd.load(std::memory_order_relaxed); }

void log_reset_for_tests() {
  std::lock_guard lock(g_configure_mutex);
  const int old = g_fd.exchange(STDERR_FILENO);
  if (old != STDERR_FILENO) ::close(old);
  log_detail::g_level.store(LogLevel::kWarn, std::memory_order_relaxed);
}

}  // namespace vf
