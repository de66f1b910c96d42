// The shim's logger. Every line is one write(2) so lines from many threads and processes never
// interleave. The level check is a single relaxed load and compare: with logging at its default
// the data path pays that one predictable branch and nothing else (no formatting, no syscalls).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string>
#include <string_view>

#include "core/log_level.h"

namespace vf {

namespace log_detail {
inline std::atomic<LogLevel> g_level{LogLevel::kWarn};
void write_line(LogLevel level, std::string_view message);
}  // namespace log_detail

inline bool log_enabled(LogLevel level) {
  return level <= log_detail::g_level.load(std::memory_order_relaxed);
}

// Points the logger at a file (empty: stderr). The file is created with the first line written
// to it, not before (a process that never logs leaves no file). Returns an error text when the
// file could not be opened (checked now, without creating it), in which case the logger keeps
// writing to stderr.
std::string log_configure(LogLevel level, const std::string& file);
LogLevel log_level();
// The fd lines go to (opening the configured file if no line has yet); the crash handler
// writes its stack there too.
int log_fd();
// Drops the file the logger holds (after fork the child reopens nothing: it keeps the same fd,
// which is shared with the parent and opened O_APPEND, so lines still land whole).
void log_reset_for_tests();

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_enabled(level)) return;
  log_detail::write_line(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace vf

#define VF_LOG_ERROR(...) ::vf::log(::vf::LogLevel::kError, __VA_ARGS__)
#define VF_LOG_WARN(...) ::vf::log(::vf::LogLevel::kWarn, __VA_ARGS__)
#define VF_LOG_INFO(...) ::vf::log(::vf::LogLevel::kInfo, __VA_ARGS__)
#define VF_LOG_DEBUG(...) ::vf::log(::vf::LogLevel::kDebug, __VA_ARGS__)
