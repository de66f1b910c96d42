#include "core/device_pairs.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace vf {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::optional<PortRef> parse_port_ref(std::string_view text) {
  text = trim(text);
  PortRef ref;
  const auto slash = text.find('/');
  const std::string_view name = slash == std::string_view::npos ? text : text.substr(0, slash);
  if (name.empty() || name.find_first_of(" \t:,") != std::string_view::npos) return std::nullopt;
  ref.device = std::string(name);
  if (slash != std::string_view::npos) {
    const std::string_view digits = text.substr(slash + 1);
    unsigned value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (error != std::errc() || end != digits.data() + digits.size() || value < 1 || value > 255) {
      return std::nullopt;
    }
    ref.port = static_cast<std::uint8_t>(value);
  }
  return ref;
}

std::string describe(const PortRef& ref) { return fmt::format("{}/{}", ref.device, ref.port); }

}  // namespace

PairsParseResult parse_device_pairs(std::string_view text) {
  PairsParseResult result;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view entry = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    std::optional<PortRef> primary;
    std::optional<PortRef> backup;
    if (colon != std::string_view::npos && entry.find(':', colon + 1) == std::string_view::npos) {
      primary = parse_port_ref(entry.substr(0, colon));
      backup = parse_port_ref(entry.substr(colon + 1));
    }
    if (!primary || !backup) {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_PAIRS entry '{}' is not PRIMARY:BACKUP with each DEVICE or DEVICE/PORT "
          "(port 1-255); entry ignored",
          entry));
      continue;
    }
    if (*primary == *backup) {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_PAIRS entry '{}' pairs {} with itself; entry ignored", entry,
          describe(*primary)));
      continue;
    }
    if (backup_for(result.rules, *primary)) {
      result.problems.push_back(fmt::format(
          "VERBS_FAILOVER_PAIRS entry '{}' names {} as a primary a second time; the first entry "
          "wins",
          entry, describe(*primary)));
      continue;
    }
    result.rules.push_back({*primary, *backup});
  }
  return result;
}

std::vector<PairingRule> automatic_pairs(std::vector<PortInfo> ports) {
  std::sort(ports.begin(), ports.end(), [](const PortInfo& a, const PortInfo& b) {
    return a.device != b.device ? a.device < b.device : a.port < b.port;
  });
  std::vector<PairingRule> rules;
  const std::size_t count = ports.size();
  for (std::size_t i = 0; i < count; ++i) {
    const PortInfo& primary = ports[i];
    if (!primary.active) continue;
    std::optional<std::size_t> other_device;
    std::optional<std::size_t> same_device;
    for (std::size_t step = 1; step < count; ++step) {
      const std::size_t j = (i + step) % count;
      const PortInfo& candidate = ports[j];
      if (!candidate.active || candidate.link_layer != primary.link_layer) continue;
      if (candidate.device != primary.device) {
        other_device = j;
        break;
      }
      if (!same_device) same_device = j;
    }
    const std::optional<std::size_t> chosen = other_device ? other_device : same_device;
    if (chosen) {
      rules.push_back({{primary.device, primary.port}, {ports[*chosen].device, ports[*chosen].port}});
    }
  }
  return rules;
}

std::optional<PortRef> backup_for(const std::vector<PairingRule>& rules, const PortRef& primary) {
  for (const PairingRule& rule : rules) {
    if (rule.primary == primary) return rule.backup;
  }
  return std::nullopt;
}

}  // namespace vf
