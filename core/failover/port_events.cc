#include "core/failover/port_events.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/failover/pair_end.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_switch.h"
#include "core/failover/protection_status.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

void on_port_change(Engine& e, int device, std::uint8_t port, ibv_port_state state) {
  PortInfoState& info = e.devices[device].ports[port];
  if (info.state == state) return;
  const ibv_port_state before = info.state;
  info.state = state;
  ++info.changes;
  info.standby_gid_index = -1;  // chosen again: an address may have been removed or added
  if (state == IBV_PORT_ACTIVE && before != IBV_PORT_NOP) {
    info.active_since_ns = monotonic_ns();
    info.stability_wait_logged = false;
  }
  VF_LOG_INFO("failover: port {}/{} is {} (was {})", e.devices[device].name, port,
              port_state_name(state), port_state_name(before));
  const bool down = state != IBV_PORT_ACTIVE;
  if (down) {  // every path on the port first: an SRQ's move must see all its members' paths dead
    for (auto& [key, p] : e.protections) {
      for (int path = 0; path < kPathCount; ++path) {
        PhysicalPath& physical = p.qp->path[path];
        if (!p.destroyed && physical.device_index == device && physical.port == port) {
          physical.failed = true;
        }
      }
    }
  }
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    VirtualQp& v = *p.qp;
    for (int path = 0; path < kPathCount; ++path) {
      if (v.path[path].device_index != device || v.path[path].port != port) continue;
      // An idle path: the failover handshake will not tell the peer about it, this side must.
      const bool idle = v.active_path() != path && !p.sw.in_progress;
      if (down) {
        if (v.active_path() == path && !p.sw.in_progress) {
          start_switch(e, p, other_path(path), FailoverReason::kPortDown);
        }
        // Whether it just moved (alone, or with its SRQ) or had moved before: one path left.
        if (p.paired && v.active_path() != path) {
          set_unprotected(p, fmt::format("its {} path's port {}/{} is down; running on the {} "
                                         "path alone",
                                         path_name(path), e.devices[device].name, port,
                                         path_name(v.active_path())));
        }
        if (p.paired && v.active_path() != path) {
          // A reply to a request sent before the loss would connect a QP whose port is down.
          p.rearm[path].awaiting = false;
          p.rearm[path].needed = true;
          p.rearm[path].notice_sent_ns = 0;  // the "up" notice goes as soon as the port is back
        }
        if (p.paired && idle) send_path_status(e, p, path, false);
      } else if (p.paired && v.active_path() != path) {
        p.hold[path] = HoldDown{};  // a port event: whatever failed may have been repaired
        p.rearm[path].not_before_ns = 0;  // and a GID that was gone may be back: look now
        p.rearm[path].gid_wait_logged = false;
        if (!p.rearm[path].needed && v.path[path].connected) {
          // The port blinked while the path idled: its QP may be in error; re-arm it anyway.
          p.rearm[path].needed = true;
        }
        maybe_rearm(e, p, path);  // the asker asks; the answerer says its port is back
      }
    }
  }
}

namespace {

// IBV_EVENT_CQ_ERR on the engine's context: when `cq` is a shadow, it overran and is lost for good
// (completions of its standby QPs with it: issue 19 item 9). Said once. A QP of its CQ on its
// primary ends its pair (the peer told); one on the standby goes back to its primary if it can;
// none uses its standby again (VirtualQp::standby_lost). False when `cq` is no shadow.
bool on_shadow_cq_error(Engine& e, ibv_cq* cq) {
  CqState* state = nullptr;
  for (auto& [app_cq, candidate] : e.cqs) {
    if (candidate->shadow == cq) state = candidate.get();
  }
  if (state == nullptr) return false;
  if (state->shadow_failed) return true;
  state->shadow_failed = true;
  VF_LOG_ERROR("failover: the shadow of cq {} on {} overran (CQ_ERR): completions of its standby "
               "QPs are lost with it; its QPs leave the standby and do not use it again",
               static_cast<const void*>(state->app_cq), e.devices[state->shadow_device_index].name);
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    VirtualQp& v = *p.qp;
    if (v.send_cq != state && v.recv_cq != state) continue;
    v.path[kStandby].failed = true;
    const char* why = "its CQ's shadow on the backup device overran and is lost; its standby is "
                      "not used again";
    if (v.active_path() == kPrimary && !p.sw.in_progress) {
      // The pair is over (the peer is told, so that it neither switches nor re-arms towards a
      // standby this end cannot use); the QP goes on on its primary, unprotected.
      end_pair(e, p, why);
      continue;
    }
    // On the standby: back to the primary if it can (its completions on the lost shadow may be
    // lost: docs/design.md §5h).
    if (v.active_path() == kStandby && !p.sw.in_progress) {
      start_switch(e, p, kPrimary, FailoverReason::kErrorCompletion);
    }
    if (p.unprotected_reason.empty() && !p.ended) set_unprotected(p, why);
  }
  return true;
}

}  // namespace

void on_device_event(Engine& e, int device) {
  ibv_async_event event{};
  if (e.verbs.get_async_event(e.devices[device].context, &event) != 0) return;
  switch (event.event_type) {
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE: {
      const int port = event.element.port_num;
      if (port >= 1 && port <= e.devices[device].port_count) {
        const auto port_number = static_cast<std::uint8_t>(port);
        ibv_port_attr attr{};
        ibv_port_state state =
            event.event_type == IBV_EVENT_PORT_ERR ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
        if (e.verbs.query_port(e.devices[device].context, port_number, &attr) == 0) {
          state = attr.state;
        }
        // A port that went down and is back by the time its event is read still went down: its
        // paths lost what was in flight, and its return starts the wait for stability afresh.
        if (event.event_type == IBV_EVENT_PORT_ERR && state == IBV_PORT_ACTIVE) {
          VF_LOG_INFO("failover: port {}/{} went down and is ACTIVE again already",
                      e.devices[device].name, port);
          on_port_change(e, device, port_number, IBV_PORT_DOWN);
        }
        on_port_change(e, device, port_number, state);
      }
      break;
    }
    case IBV_EVENT_CQ_ERR:
      if (!on_shadow_cq_error(e, event.element.cq)) {
        VF_LOG_WARN("failover: CQ_ERR on {} for a CQ the engine does not know",
                    e.devices[device].name);
      }
      break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      // A standby QP of ours failed: that path needs re-arming before it can carry traffic.
      for (auto& [key, p] : e.protections) {
        if (p.destroyed) continue;
        if (p.qp->path[kStandby].qp == event.element.qp) {
          p.qp->path[kStandby].failed = true;
          if (p.qp->active_path() == kStandby)
            start_switch(e, p, kPrimary, FailoverReason::kErrorCompletion);
        }
      }
      break;
    default:
      break;
  }
  e.verbs.ack_async_event(&event);
}

bool hide_async_event(Engine& e, ibv_context* context, const ibv_async_event& event) {
  const int device = device_of_context(e, context);
  if (device < 0) return false;
  switch (event.event_type) {
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE: {
      const int port = event.element.port_num;
      if (port < 1 || port > e.devices[device].port_count) return false;
      PortInfoState& info = e.devices[device].ports[port];
      if (info.backup_device < 0) return false;
      info.hidden_async_events.fetch_add(1);
      VF_LOG_INFO("failover: hid {} of {}/{} from the application",
                  e.verbs.event_type_str(event.event_type), e.devices[device].name, port);
      return true;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR: {
      VirtualQp* v = find_virtual_qp(event.element.qp);
      if (v == nullptr) return false;
      auto it = e.protections.find(v);
      if (it == e.protections.end()) return false;
      Protection& p = it->second;
      if (event.event_type == IBV_EVENT_COMM_EST) return false;
      if (v->application_failed.load()) return false;
      const bool switching_or_moved = p.sw.in_progress || v->active_path() != kPrimary;
      const bool can_move = can_switch_to(p, kStandby);
      if (!switching_or_moved && !can_move) return false;
      v->counters.hidden_async_events.fetch_add(1);
      if (!switching_or_moved) v->link_error_seen.store(true);
      wake_engine(e);
      return true;
    }
    case IBV_EVENT_QP_LAST_WQE_REACHED: {
      // An SRQ's QP reports it when it enters ERR: the shim's doing during a switch.
      VirtualQp* v = find_virtual_qp(event.element.qp);
      if (v == nullptr || v->srq == nullptr || v->application_failed.load()) return false;
      v->counters.hidden_async_events.fetch_add(1);
      return true;
    }
    case IBV_EVENT_CQ_ERR: {
      // An overrun caused by the flush of a switched QP is the shim's doing, not the app's.
      return false;
    }
    default:
      return false;
  }
}

}  // namespace vf::failover
