// Runtime configuration read from the environment. Parsing is pure (it takes a lookup function)
// so unit tests can drive every branch without touching the process environment.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log_level.h"

namespace vf {

struct Config {
  bool enabled = true;               // VERBS_FAILOVER=0 turns every hook into a direct call
  LogLevel log_level = LogLevel::kWarn;
  std::string log_file;              // empty: stderr; "%p" already expanded to the pid
  bool backtrace = false;            // VERBS_FAILOVER_BACKTRACE=1
};

// One line per problem, each naming the variable and what it accepts; the caller prints them.
struct ConfigResult {
  Config config;
  std::vector<std::string> problems;
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

ConfigResult parse_config(const EnvLookup& env, int pid);

std::optional<LogLevel> parse_log_level(std::string_view text);
std::optional<bool> parse_bool(std::string_view text);
// Replaces every "%p" with the pid and "%%" with "%", like core_pattern does.
std::string expand_path_pattern(std::string_view pattern, int pid);

}  // namespace vf
