#include "core/failover/devices.h"

#include <arpa/inet.h>

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/device_pairs.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

Gid gid_of(const ibv_gid& gid) {
  Gid out{};
  std::memcpy(out.data(), gid.raw, out.size());
  return out;
}

ibv_gid to_ibv_gid(const Gid& gid) {
  ibv_gid out{};
  std::memcpy(out.raw, gid.data(), gid.size());
  return out;
}

int device_of_context(Engine& e, const ibv_context* context) {
  for (int i = 0; i < e.device_count; ++i) {
    if (e.devices[i].device == context->device ||
        std::strcmp(e.devices[i].name.c_str(), context->device->name) == 0) {
      return i;
    }
  }
  return -1;
}

std::string gid_text(const Gid& gid) {
  char text[INET6_ADDRSTRLEN] = "";
  inet_ntop(AF_INET6, gid.data(), text, sizeof text);
  return text;
}

bool gid_is_zero(const Gid& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}

namespace {

// Slots to search: the port's gid_tbl_len, at most kMaxGidScan (unknown: kMaxGidScan, the scan
// then ends at the first index the device refuses).
int gid_slots(Engine& e, int device, std::uint8_t port) {
  ibv_port_attr attr{};
  if (e.verbs.query_port(e.devices[device].context, port, &attr) == 0 && attr.gid_tbl_len > 0) {
    return std::min(attr.gid_tbl_len, kMaxGidScan);
  }
  return kMaxGidScan;
}

}  // namespace

int gid_type_at(Engine& e, int device, std::uint8_t port, int index) {
  int type = -1;
  if (e.verbs.query_gid_type == nullptr ||
      e.verbs.query_gid_type(e.devices[device].context, port, index, &type) != 0) {
    return -1;
  }
  return type;
}

namespace {

// standby_gid_index's choice, asked of the device (devices.h says which GID).
int choose_standby_gid(Engine& e, int device, std::uint8_t port, Gid* gid, int* type) {
  int ipv4 = -1;  // the first IPv4-mapped GID, whatever its type
  int any = -1;   // the first GID at all
  Gid ipv4_gid{}, any_gid{};
  const int slots = gid_slots(e, device, port);
  for (int index = 0; index < slots; ++index) {
    ibv_gid raw{};
    if (e.verbs.query_gid(e.devices[device].context, port, index, &raw) != 0) break;
    const Gid candidate = gid_of(raw);
    if (gid_is_zero(candidate)) continue;  // an empty slot
    if (ipv4_of_gid(candidate) != 0) {
      const int candidate_type = gid_type_at(e, device, port, index);
      if (candidate_type == IBV_GID_TYPE_ROCE_V2 || candidate_type < 0) {
        *gid = candidate;
        if (type != nullptr) *type = candidate_type;
        return index;
      }
      if (ipv4 < 0) {
        ipv4 = index;
        ipv4_gid = candidate;
      }
    } else if (any < 0) {
      any = index;
      any_gid = candidate;
    }
  }
  const int chosen = ipv4 >= 0 ? ipv4 : any;
  *gid = ipv4 >= 0 ? ipv4_gid : any_gid;
  if (chosen < 0) return 0;
  if (type != nullptr) *type = gid_type_at(e, device, port, chosen);
  return chosen;
}

}  // namespace

int standby_gid_index(Engine& e, int device, std::uint8_t port, Gid* gid, int* type) {
  PortInfoState& cached = e.devices[device].ports[port];
  if (cached.standby_gid_index >= 0) {
    *gid = cached.standby_gid;
    if (type != nullptr) *type = cached.standby_gid_type;
    return cached.standby_gid_index;
  }
  int chosen_type = -1;
  const int chosen = choose_standby_gid(e, device, port, gid, &chosen_type);
  cached.standby_gid_index = chosen;
  cached.standby_gid = *gid;
  cached.standby_gid_type = chosen_type;
  if (type != nullptr) *type = chosen_type;
  return chosen;
}

void discover_devices(Engine& e) {
  int count = 0;
  ibv_device** list = e.verbs.get_device_list(&count);
  if (list == nullptr) return;
  std::vector<PortInfo> ports;
  for (int i = 0; i < count && e.device_count < kMaxDevices; ++i) {
    Device& d = e.devices[e.device_count];
    d.name = list[i]->name;
    d.device = list[i];
    d.context = e.verbs.open_device(list[i]);
    if (d.context == nullptr) {
      VF_LOG_WARN("failover: cannot open {} ({}); it is neither protected nor a backup", d.name,
                  strerror(errno));
      continue;
    }
    ibv_device_attr attr{};
    if (e.verbs.query_device(d.context, &attr) == 0) {
      d.port_count = std::min<std::uint8_t>(attr.phys_port_cnt, kMaxPorts);
      d.max_qp_rd_atom = std::max(1, attr.max_qp_rd_atom);
    }
    for (std::uint8_t port = 1; port <= d.port_count; ++port) {
      ibv_port_attr port_attr{};
      if (e.verbs.query_port(d.context, port, &port_attr) != 0) continue;
      d.ports[port].state = port_attr.state;
      d.ports[port].link_layer = port_attr.link_layer;
      d.ports[port].active_mtu = port_attr.active_mtu;
      ports.push_back({d.name, port, port_attr.state == IBV_PORT_ACTIVE, port_attr.link_layer});
    }
    ++e.device_count;
  }
  // The device list stays allocated: ibv_device pointers must outlive the contexts.
  std::vector<PairingRule> rules;
  if (!e.config.pairs.empty()) {
    PairsParseResult parsed = parse_device_pairs(e.config.pairs);
    for (const std::string& problem : parsed.problems) VF_LOG_WARN("{}", problem);
    rules = parsed.rules;
  } else {
    rules = automatic_pairs(ports);
  }
  for (int i = 0; i < e.device_count; ++i) {
    Device& d = e.devices[i];
    for (std::uint8_t port = 1; port <= d.port_count; ++port) {
      std::optional<PortRef> backup = backup_for(rules, PortRef{d.name, port});
      int backup_device = -1;
      if (backup) {
        for (int j = 0; j < e.device_count; ++j) {
          if (e.devices[j].name == backup->device && backup->port <= e.devices[j].port_count) {
            backup_device = j;
          }
        }
      }
      if (backup_device < 0 || (backup_device == i && backup->port == port)) {
        VF_LOG_WARN(
            "failover: {}/{} has no usable backup port{}; its QPs run unprotected "
            "(pass-through)",
            d.name, port, backup ? fmt::format(" ({} not found)", backup->device) : "");
        continue;
      }
      d.ports[port].backup_device = backup_device;
      d.ports[port].backup_port = backup->port;
      VF_LOG_INFO("failover: {}/{} is backed up by {}/{}", d.name, port,
                  e.devices[backup_device].name, backup->port);
    }
  }
}

int gid_index_of(Engine& e, int device, std::uint8_t port, const Gid& gid, int type, int hint) {
  if (gid_is_zero(gid)) return -1;  // what an empty slot reads as: never "found"
  const auto matches = [&](int index, const ibv_gid& raw) {
    if (gid_of(raw) != gid) return false;
    if (type < 0) return true;
    const int found = gid_type_at(e, device, port, index);
    return found < 0 || found == type;
  };
  ibv_gid raw{};
  // Where it was, first: on a NIC with RoCE v1 and v2 the same address is in two slots, and the
  // first match would be the v1 one.
  if (hint >= 0 && hint < kMaxGidScan &&
      e.verbs.query_gid(e.devices[device].context, port, hint, &raw) == 0 && matches(hint, raw)) {
    return hint;
  }
  const int slots = gid_slots(e, device, port);
  for (int index = 0; index < slots; ++index) {
    if (e.verbs.query_gid(e.devices[device].context, port, index, &raw) != 0) return -1;
    if (matches(index, raw)) return index;
  }
  return -1;
}

bool gid_of_port(Engine& e, int device, std::uint8_t port, const Gid& gid) {
  return gid_index_of(e, device, port, gid) >= 0;
}

bool port_active(Engine& e, int device, std::uint8_t port) {
  return e.devices[device].ports[port].state == IBV_PORT_ACTIVE;
}

bool port_stable(Engine& e, int device, std::uint8_t port, std::uint64_t now) {
  PortInfoState& info = e.devices[device].ports[port];
  if (info.state != IBV_PORT_ACTIVE) return false;
  if (info.active_since_ns == 0 || now >= info.active_since_ns + e.port_stable_ns) return true;
  if (!info.stability_wait_logged) {
    info.stability_wait_logged = true;
    VF_LOG_INFO("failover: port {}/{} is ACTIVE again; its paths are re-armed once it has stayed "
                "ACTIVE for {} ms (VERBS_FAILOVER_PORT_STABLE_MS)",
                e.devices[device].name, port, e.port_stable_ns / 1'000'000);
  }
  return false;
}

}  // namespace vf::failover
