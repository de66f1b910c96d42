#include "core/cm_events.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/log.h"

namespace vf {

namespace {
char g_helper_tag;
}  // namespace

void* CmEvents::helper_context() {
  return &g_helper_tag;
}

int CmEvents::get_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (event == nullptr) {  // as librdmacm: EINVAL, before anything is read
    errno = EINVAL;
    return -1;
  }
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (rdma_cm_event* own = take_ready(channel)) {
        *event = show(own);
        return 0;
      }
    }
    rdma_cm_event* real = nullptr;
    const int rc = api_.get_cm_event(channel, &real);
    if (rc != 0) return rc;
    std::unique_lock lock(mu_);
    if (real->id != nullptr && real->id->context == helper_context()) {
      // A helper's event stands for one of the shim's (its first; any later one is only
      // dropped): never shown, acknowledged, and the helper goes (rdma_destroy_id waits for
      // its events to be acknowledged: ack first).
      rdma_cm_id* helper = real->id;
      rdma_cm_event* own = nullptr;
      if (auto it = helpers_.find(helper); it != helpers_.end()) {
        own = it->second;
        helpers_.erase(it);
      }
      lock.unlock();
      api_.ack_cm_event(real);
      if (own == nullptr) continue;
      api_.destroy_id(helper);
      lock.lock();
      if (may_show_own(own)) {
        *event = show(own);
        return 0;
      }
      pending_.erase(own);
      delete own;  // its id was destroyed, or the CM's own DISCONNECTED came first
      continue;
    }
    if (real->event == RDMA_CM_EVENT_ESTABLISHED && real->id != nullptr && real->id->qp != nullptr) {
      ibv_qp* qp = real->id->qp;
      ids_[real->id] = IdState{qp, qp->qp_num, false};
      const auto early = std::find(early_.begin(), early_.end(), std::make_pair(qp, qp->qp_num));
      if (early != early_.end()) {
        // The disconnect came before this ESTABLISHED was read: the application gets it
        // first, and the DISCONNECTED after it (a helper's event wakes a reader that polls).
        early_.erase(early);
        give_disconnected_locked(real->id);
      }
    } else if (real->event == RDMA_CM_EVENT_DISCONNECTED && real->id != nullptr) {
      auto it = ids_.find(real->id);
      if (it != ids_.end() && it->second.disconnect_shown) {
        const std::uint32_t qpn = it->second.qpn;
        lock.unlock();
        VF_LOG_DEBUG("rdma_cm: the CM's DISCONNECTED for qp {} came after the shim's; dropped",
                     qpn);
        api_.ack_cm_event(real);
        continue;
      }
      if (it != ids_.end()) it->second.disconnect_shown = true;
    }
    *event = real;
    return 0;
  }
}

bool CmEvents::ack_own_event(rdma_cm_event* event) {
  std::lock_guard lock(mu_);
  if (shown_.erase(event) == 0) return false;
  delete event;
  acked_.notify_all();
  return true;
}

void CmEvents::before_destroy(rdma_cm_id* id) {
  std::unique_lock lock(mu_);
  if (auto it = ids_.find(id); it != ids_.end()) it->second.destroying = true;
  for (rdma_cm_event* own : pending_) {
    if (own->id == id) own->id = nullptr;  // dropped where it waits (helper, ready queue)
  }
  acked_.wait(lock, [&] {
    return std::none_of(shown_.begin(), shown_.end(), [&](rdma_cm_event* own) {
      return own->id == id && own != id->event;
    });
  });
}

void CmEvents::after_destroy(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  // A new id at the same address may have reached ESTABLISHED since: its entry stays.
  if (auto it = ids_.find(id); it != ids_.end() && it->second.destroying) ids_.erase(it);
}

void CmEvents::disconnected(ibv_qp* qp, std::uint32_t qpn) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(ids_.begin(), ids_.end(), [&](const auto& entry) {
    return entry.second.qp == qp && entry.second.qpn == qpn && !entry.second.destroying;
  });
  if (it == ids_.end()) {
    // Its ESTABLISHED may not be read yet (or the QP is not rdma_cm's: then it never is).
    VF_LOG_DEBUG("rdma_cm: qp {} has no rdma_cm id that saw ESTABLISHED yet; its DISCONNECTED "
                 "waits for it",
                 qpn);
    if (early_.size() == kMaxEarlyDisconnects) early_.pop_front();
    early_.emplace_back(qp, qpn);
    return;
  }
  if (it->second.disconnect_shown) return;  // the CM's own came first
  give_disconnected_locked(it->first);
}

bool CmEvents::disconnect_shown(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  auto it = ids_.find(id);
  return it != ids_.end() && it->second.disconnect_shown;
}

void CmEvents::give_disconnected_locked(rdma_cm_id* id) {
  auto* own = new rdma_cm_event{};
  own->id = id;
  own->event = RDMA_CM_EVENT_DISCONNECTED;
  pending_.insert(own);
  // Read now, not when the id was known: rdma_migrate_id may have moved it to another channel.
  rdma_event_channel* channel = id->channel;
  // The id's own address first (its device is open), else the loopback of the same family: a
  // helper that failed to resolve stays bound to the family it tried, so each try has its own.
  std::vector<sockaddr_storage> targets;
  const sockaddr* source = rdma_get_local_addr(id);
  sockaddr_storage target{};
  if (source->sa_family == AF_INET6) {
    memcpy(&target, source, sizeof(sockaddr_in6));
    reinterpret_cast<sockaddr_in6*>(&target)->sin6_port = 0;
    targets.push_back(target);
    target = {};
    auto* loopback = reinterpret_cast<sockaddr_in6*>(&target);
    loopback->sin6_family = AF_INET6;
    loopback->sin6_addr = in6addr_loopback;
    targets.push_back(target);
  } else {
    if (source->sa_family == AF_INET) {
      memcpy(&target, source, sizeof(sockaddr_in));
      reinterpret_cast<sockaddr_in*>(&target)->sin_port = 0;
      targets.push_back(target);
      target = {};
    }
    auto* loopback = reinterpret_cast<sockaddr_in*>(&target);
    loopback->sin_family = AF_INET;
    loopback->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    targets.push_back(target);
  }
  int error = 0;
  for (sockaddr_storage& to : targets) {
    rdma_cm_id* helper = nullptr;
    if (api_.create_id(channel, &helper, helper_context(), RDMA_PS_TCP) != 0) {
      error = errno;
      break;
    }
    // Known before it can have an event (the resolution queues it).
    helpers_[helper] = own;
    if (api_.resolve_addr(helper, nullptr, reinterpret_cast<sockaddr*>(&to),
                          kHelperResolveTimeoutMs) == 0) {
      return;
    }
    error = errno;
    helpers_.erase(helper);
    api_.destroy_id(helper);  // no event: nothing to wait for
  }
  VF_LOG_WARN("rdma_cm: no helper id could wake the reader of the event channel ({}); the "
              "DISCONNECTED is given at the channel's next rdma_get_cm_event",
              strerror(error));
  ready_[channel].push_back(own);
}

rdma_cm_event* CmEvents::take_ready(rdma_event_channel* channel) {
  auto it = ready_.find(channel);
  if (it == ready_.end()) return nullptr;
  std::deque<rdma_cm_event*>& queue = it->second;
  while (!queue.empty()) {
    rdma_cm_event* own = queue.front();
    queue.pop_front();
    if (may_show_own(own)) return own;
    pending_.erase(own);
    delete own;
  }
  ready_.erase(it);
  return nullptr;
}

bool CmEvents::may_show_own(rdma_cm_event* own) {
  if (own->id == nullptr) return false;
  auto it = ids_.find(own->id);
  if (it == ids_.end() || it->second.destroying || it->second.disconnect_shown) return false;
  it->second.disconnect_shown = true;
  return true;
}

rdma_cm_event* CmEvents::show(rdma_cm_event* own) {
  pending_.erase(own);
  shown_.insert(own);
  return own;
}

std::size_t CmEvents::ids_known() {
  std::lock_guard lock(mu_);
  return ids_.size();
}

}  // namespace vf
