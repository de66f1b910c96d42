#include "core/failover/protection_status.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

void mark_protected(Engine& e, Protection& p) {
  VirtualQp& v = *p.qp;
  p.paired = true;
  p.pairing = false;
  v.path[kPrimary].connected = true;
  v.path[kStandby].connected = true;
  p.unprotected_reason.clear();
  VF_LOG_INFO("qp {}: protected — standby qp {} on {}/{} paired with the peer's qp {} {}{}", v.vqpn,
              v.path[kStandby].qp->qp_num, e.devices[v.path[kStandby].device_index].name,
              v.path[kStandby].port, p.remote.qpn,
              p.peer.local ? std::string("(same process)")
                           : fmt::format("(pid {} at {})", p.peer.pid,
                                         p.peer.addresses.empty() ? std::string("?")
                                                                  : ipv4_text(p.peer.addresses[0])),
              p.standby_ece.vendor_id == 0
                  ? std::string()
                  : fmt::format(", ECE options {:#x} of vendor {:#x}", p.standby_ece.options,
                                p.standby_ece.vendor_id));
}

void set_unprotected(Protection& p, std::string reason) {
  if (p.unprotected_reason == reason) return;
  // A pair that is over keeps the reason it ended with: later news of its paths changes nothing.
  if (p.ended && !p.unprotected_reason.empty()) return;
  p.unprotected_reason = std::move(reason);
  VF_LOG_WARN("qp {}: unprotected — {}", p.qp->vqpn, p.unprotected_reason);
}

Protection* protection_by_key(Engine& e, const QpKey& key) {
  for (auto& [v, p] : e.protections) {
    if (p.destroyed) continue;
    if (p.local == key) return &p;
  }
  for (auto& [v, p] : e.protections) {
    if (p.destroyed || p.local.qpn != 0 || v->vqpn != key.qpn) continue;
    if (gid_of_port(e, v->path[kPrimary].device_index, v->path[kPrimary].port, key.gid)) {
      p.local = key;
      v->path[kPrimary].gid = key.gid;
      return &p;
    }
  }
  return nullptr;
}

}  // namespace vf::failover
