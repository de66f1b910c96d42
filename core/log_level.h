#pragma once

#include <cstdint>
#include <string_view>

namespace vf {

enum class LogLevel : std::uint8_t { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

constexpr std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kTrace: return "trace";
  }
  return "?";
}

inline constexpr std::string_view kAcceptedLogLevels = "error|warn|info|debug|trace";

}  // namespace vf
