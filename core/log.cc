#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace vf {
namespace {

// g_fd is the sink; kOpenOnFirstLine means "a file is configured but not opened yet": a job-wide
// preload reaches every shell and data-loader worker, and a file must appear only when there is a
// line for it. The path lives in a fixed buffer so that the crash handler can open it without
// allocating.
constexpr int kOpenOnFirstLine = -2;
std::atomic<int> g_fd{STDERR_FILENO};
std::mutex g_configure_mutex;
constexpr std::size_t kMaxPath = 4096;
char g_path[kMaxPath];

int open_log_file(const char* path) {
  return ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

// The sink for the next line: opens the configured file on first use. Lock-free and
// async-signal-safe (open(2) and a compare-exchange), so the crash handler may call it; two
// threads racing here each open, one wins, the other closes its fd. A file that cannot be opened
// now (checked at configure time, so something changed since) falls back to stderr.
int sink_fd() {
  int fd = g_fd.load(std::memory_order_acquire);
  if (fd != kOpenOnFirstLine) return fd;
  int opened = open_log_file(g_path);
  if (opened < 0) opened = STDERR_FILENO;
  int expected = kOpenOnFirstLine;
  if (!g_fd.compare_exchange_strong(expected, opened, std::memory_order_acq_rel)) {
    if (opened != STDERR_FILENO) ::close(opened);
    return expected;
  }
  return opened;
}

// Checks, without creating the file, that it can be opened for appending. An existing file is
// opened now (returned, nothing is created). For a new one the directory is probed with an
// O_TMPFILE file that vanishes on close (access(2) would say yes to root on any directory); where
// the filesystem has no O_TMPFILE, access(2) decides. Returns the open fd, kOpenOnFirstLine, or
// -1 with the reason in errno.
int check_log_file(const std::string& file) {
  const int existing = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (existing >= 0 || errno != ENOENT) return existing;
  const std::size_t slash = file.rfind('/');
  const std::string directory =
      slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  const int probe = ::open(directory.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (probe >= 0) {
    ::close(probe);
    return kOpenOnFirstLine;
  }
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -1;
  return ::access(directory.c_str(), W_OK | X_OK) == 0 ? kOpenOnFirstLine : -1;
}

void drop_sink() {
  const int old = g_fd.exchange(STDERR_FILENO);
  if (old >= 0 && old != STDERR_FILENO) ::close(old);
}

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
  write_all(sink_fd(), line.data(), line.size());
  errno = saved_errno;
}

}  // namespace log_detail

std::string log_configure(LogLevel level, const std::string& file) {
  std::lock_guard lock(g_configure_mutex);
  log_detail::g_level.store(level, std::memory_order_relaxed);
  if (file.empty()) return {};
  const int fd = file.size() < kMaxPath ? check_log_file(file) : -1;
  if (fd == -1) {
    return fmt::format(
        "VERBS_FAILOVER_LOG_FILE='{}' cannot be opened ({}); accepted values: a writable file "
        "path (%p = pid); logging to stderr",
        file, file.size() >= kMaxPath ? "path too long" : ::strerror(errno));
  }
  drop_sink();
  std::memcpy(g_path, file.c_str(), file.size() + 1);
  g_fd.store(fd, std::memory_order_release);
  return {};
}

LogLevel log_level() { return log_detail::g_level.load(std::memory_order_relaxed); }

int log_fd() { return sink_fd(); }

void log_reset_for_tests() {
  std::lock_guard lock(g_configure_mutex);
  drop_sink();
  log_detail::g_level.store(LogLevel::kWarn, std::memory_order_relaxed);
}

}  // namespace vf
