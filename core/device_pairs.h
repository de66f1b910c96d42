// Which port backs up which: VERBS_FAILOVER_PAIRS, or an automatic choice every host makes alike.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vf {

struct PortRef {
  std::string device;
  std::uint8_t port = 1;
  bool operator==(const PortRef&) const = default;
};

struct PairingRule {
  PortRef primary;
  PortRef backup;
};

struct PairsParseResult {
  std::vector<PairingRule> rules;
  std::vector<std::string> problems;  // one line each, naming the variable and the entry
};

// "mlx5_0:mlx5_1,mlx5_1:mlx5_0" or with ports "mlx5_0/1:mlx5_1/1". Entries that cannot be
// understood are reported and skipped; the others stay usable.
PairsParseResult parse_device_pairs(std::string_view text);

struct PortInfo {
  std::string device;
  std::uint8_t port = 1;
  bool active = false;
  int link_layer = 0;  // IBV_LINK_LAYER_*
};

// Automatic pairing: ports are ordered by (device name, port number); each active port is backed
// by the next active port of the same link layer in that cyclic order, preferring another device
// (an independent NIC) over another port of the same device. Every host with the same device
// names therefore chooses alike. A port with no candidate gets no rule (pass-through).
std::vector<PairingRule> automatic_pairs(std::vector<PortInfo> ports);

std::optional<PortRef> backup_for(const std::vector<PairingRule>& rules, const PortRef& primary);

}  // namespace vf
