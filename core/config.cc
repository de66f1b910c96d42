#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

namespace vf {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view text) {
  static constexpr std::array kLevels = {LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo,
                                         LogLevel::kDebug, LogLevel::kTrace};
  const std::string lower = lowercase(text);
  for (LogLevel level : kLevels) {
    if (lower == log_level_name(level)) return level;
  }
  return std::nullopt;
}

std::optional<bool> parse_bool(std::string_view text) {
  const std::string lower = lowercase(text);
  if (lower == "1" || lower == "on" || lower == "yes" || lower == "true") return true;
  if (lower == "0" || lower == "off" || lower == "no" || lower == "false") return false;
  return std::nullopt;
}

std::string expand_path_pattern(std::string_view pattern, int pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

ConfigResult parse_config(const EnvLookup& env, int pid) {
  ConfigResult result;
  Config& config = result.config;

  auto boolean = [&](std::string_view name, bool& target) {
    if (auto value = env(name)) {
      if (auto parsed = parse_bool(*value)) {
        target = *parsed;
      } else {
        result.problems.push_back(fmt::format(
            "{}='{}' is not understood; accepted values: 1|0|on|off|yes|no|true|false; using {}",
            name, *value, target ? "1" : "0"));
      }
    }
  };

  boolean("VERBS_FAILOVER", config.enabled);
  boolean("VERBS_FAILOVER_BACKTRACE", config.backtrace);

  if (auto value = env("VERBS_FAILOVER_LOG")) {
    if (auto level = parse_log_level(*value)) {
      config.log_level = *level;
    } else {
      result.problems.push_back(
          fmt::format("VERBS_FAILOVER_LOG='{}' is not a log level; accepted values: {}; using {}",
                      *value, kAcceptedLogLevels, log_level_name(config.log_level)));
    }
  }
  if (auto value = env("VERBS_FAILOVER_LOG_FILE")) {
    if (value->empty()) {
      result.problems.push_back(
          "VERBS_FAILOVER_LOG_FILE is set but empty; accepted values: a file path (%p = pid); "
          "logging to stderr");
    } else {
      config.log_file = expand_path_pattern(*value, pid);
    }
  }
  return result;
}

}  // namespace vf
