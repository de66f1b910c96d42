#include "core/config.h"

#include <fmt/format.h>

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace vf {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// A decimal integer, digits only (no sign, no spaces, no suffix).
std::optional<unsigned long> parse_unsigned(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  unsigned long value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<unsigned long>(c - '0');
  }
  return value;
}

// Seconds as "10", "0.5", "2.25": digits with at most one decimal point, no sign or exponent.
std::optional<double> parse_seconds(std::string_view text) {
  if (text.empty() || text.size() > 32) return std::nullopt;
  bool digit = false;
  bool point = false;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c == '.' && !point) {
      point = true;
    } else {
      return std::nullopt;
    }
  }
  if (!digit) return std::nullopt;
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

constexpr std::string_view kCtrlAddrsSyntax =
    "[PORT|FIRST-LAST][@ADDR[,ADDR...]] (ports 1-65535, at most 1024 in a range; ADDR a dotted "
    "IPv4 address)";

struct CtrlAddrs {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  std::vector<std::string> addresses;
};

// Parses VERBS_FAILOVER_CTRL_ADDRS; on failure `bad` names the offending part.
std::optional<CtrlAddrs> parse_ctrl_addrs(std::string_view text, std::uint16_t default_first,
                                          std::uint16_t default_last, std::string& bad) {
  CtrlAddrs out{default_first, default_last, {}};
  const std::size_t at = text.find('@');
  const std::string_view ports = text.substr(0, at);
  if (!ports.empty()) {
    const std::size_t dash = ports.find('-');
    const auto port = [](std::string_view part) -> std::optional<std::uint16_t> {
      const auto value = parse_unsigned(part);
      if (!value || *value < 1 || *value > 65535) return std::nullopt;
      return static_cast<std::uint16_t>(*value);
    };
    const auto first = port(ports.substr(0, dash));
    if (!first) {
      bad = fmt::format("port '{}' is not a number in 1-65535", ports.substr(0, dash));
      return std::nullopt;
    }
    auto last = first;
    if (dash != std::string_view::npos) {
      last = port(ports.substr(dash + 1));
      if (!last) {
        bad = fmt::format("port '{}' is not a number in 1-65535", ports.substr(dash + 1));
        return std::nullopt;
      }
      if (*last < *first) {
        bad = fmt::format("port range '{}' ends before it starts", ports);
        return std::nullopt;
      }
      if (*last - *first + 1 > 1024) {
        bad = fmt::format("port range '{}' spans {} ports (at most 1024)", ports,
                          *last - *first + 1);
        return std::nullopt;
      }
    }
    out.first = *first;
    out.last = *last;
  }
  if (at != std::string_view::npos) {
    std::string_view rest = text.substr(at + 1);
    if (rest.empty()) {
      bad = "'@' is not followed by an address";
      return std::nullopt;
    }
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string address(rest.substr(0, comma));
      in_addr parsed{};
      if (address.empty() || inet_pton(AF_INET, address.c_str(), &parsed) != 1) {
        bad = fmt::format("address '{}' is not a dotted IPv4 address", address);
        return std::nullopt;
      }
      out.addresses.push_back(address);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
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
  auto milliseconds = [&](std::string_view name, std::uint32_t max, std::uint32_t& target) {
    if (auto value = env(name)) {
      const auto ms = parse_unsigned(*value);
      if (ms && *ms <= max) {
        target = static_cast<std::uint32_t>(*ms);
      } else {
        result.problems.push_back(fmt::format(
            "{}='{}' is not a duration; accepted values: milliseconds, an integer 0-{}; using {}",
            name, *value, max, target));
      }
    }
  };

  boolean("VERBS_FAILOVER", config.enabled);
  boolean("VERBS_FAILOVER_BACKTRACE", config.backtrace);
  boolean("VERBS_FAILOVER_FAILBACK", config.failback);

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
  if (auto value = env("VERBS_FAILOVER_PAIRS")) config.pairs = *value;
  if (auto value = env("VERBS_FAILOVER_STATS")) {
    if (value->empty()) {
      result.problems.push_back(
          "VERBS_FAILOVER_STATS is set but empty; accepted values: a file path (%p = pid); "
          "writing no stats file");
    } else {
      config.stats_file = expand_path_pattern(*value, pid);
    }
  }
  if (auto value = env("VERBS_FAILOVER_STATS_INTERVAL")) {
    const auto seconds = parse_seconds(*value);
    if (seconds && *seconds > 0 && *seconds <= 86400) {
      config.stats_interval_s = *seconds;
    } else {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_STATS_INTERVAL='{}' is not an interval; accepted values: seconds, a "
          "decimal number > 0 and <= 86400 (e.g. 0.5 or 10); using 0 (stats written at exit only)",
          *value));
    }
  }
  milliseconds("VERBS_FAILOVER_PORT_STABLE_MS", Config::kMaxPortStableMs, config.port_stable_ms);
  milliseconds("VERBS_FAILOVER_GRACE_MS", Config::kMaxGraceMs, config.grace_ms);
  milliseconds("VERBS_FAILOVER_PROBE_MS", Config::kMaxProbeMs, config.probe_ms);
  if (auto value = env("VERBS_FAILOVER_QP_TIMEOUT")) {
    const auto exponent = parse_unsigned(*value);
    if (exponent && *exponent >= 1 && *exponent <= 31) {
      config.qp_timeout = static_cast<std::uint8_t>(*exponent);
    } else {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_QP_TIMEOUT='{}' is not a transport timeout exponent; accepted values: "
          "an integer 1-31 (4.096 us * 2^n); using {}",
          *value, config.qp_timeout));
    }
  }
  if (auto value = env("VERBS_FAILOVER_CTRL_ADDRS")) {
    std::string bad;
    if (auto parsed = parse_ctrl_addrs(*value, config.ctrl_port_first, config.ctrl_port_last, bad)) {
      config.ctrl_port_first = parsed->first;
      config.ctrl_port_last = parsed->last;
      config.ctrl_peer_addresses = std::move(parsed->addresses);
    } else {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_CTRL_ADDRS='{}' is not understood: {}; accepted values: {}; using "
          "ports {}-{} and no peer addresses",
          *value, bad, kCtrlAddrsSyntax, config.ctrl_port_first, config.ctrl_port_last));
    }
  }
  return result;
}

}  // namespace vf
