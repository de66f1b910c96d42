#include "core/failover/cm_disconnect.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/failover/message_dispatch.h"
#include "core/log.h"

namespace vf::failover {

namespace {

Protection* find(Engine& e, VirtualQp* qp) {
  auto it = e.protections.find(qp);
  return it == e.protections.end() || it->second.destroyed ? nullptr : &it->second;
}

}  // namespace

CmAnnounce announce_cm_disconnect(Engine& e, std::unique_lock<std::mutex>& lock, VirtualQp* qp,
                                  std::uint64_t wait_ns) {
  Protection* p = find(e, qp);
  if (p == nullptr || !p->paired || p->self_connected || p->cm.from_peer) {
    return CmAnnounce::kNotSent;
  }
  if (!p->cm.asked) {
    p->cm.asked = true;
    p->cm.next_send_ns = 0;  // the engine's next pass sends it
    p->cm.until_ns = monotonic_ns() + wait_ns;
    e.cm_pending.push_back(qp);
    wake_engine(e);
  }
  const std::uint64_t until_ns = p->cm.until_ns;
  // The wait is bounded by the clock the rest of the engine uses; the condition variable's own
  // clock only paces it.
  while (true) {
    p = find(e, qp);
    if (p == nullptr || p->cm.answered) break;
    const std::uint64_t now = monotonic_ns();
    if (now >= until_ns) break;
    e.cm_answered.wait_for(lock, std::chrono::nanoseconds(until_ns - now));
  }
  p = find(e, qp);
  if (p != nullptr && p->cm.answered) {
    // The CM's answer to this side's request may have to travel a dead path (a synchronous id
    // waits for it inside rdma_disconnect): this side gets the shim's unless the CM's comes.
    VF_LOG_INFO("qp {}: the peer's shim confirmed the rdma_cm disconnect; this connection gets "
                "its RDMA_CM_EVENT_DISCONNECTED from the shim unless the CM's comes within {} ms",
                qp->vqpn, kCmDisconnectGraceNs / 1'000'000);
    e.cm_disconnects_due.push_back({qp->app_qp, qp->vqpn, monotonic_ns() + kCmDisconnectGraceNs});
    wake_engine(e);
    return CmAnnounce::kAnswered;
  }
  if (p != nullptr) {
    VF_LOG_WARN("qp {}: the peer's shim did not confirm the rdma_cm disconnect within {} ms; "
                "its application gets RDMA_CM_EVENT_DISCONNECTED only if the CM's own request "
                "reaches it",
                qp->vqpn, wait_ns / 1'000'000);
  }
  return CmAnnounce::kUnanswered;
}

void answer_unknown_cm_disconnect(Engine& e, const PeerRef& from, const CmDisconnect& m) {
  const CmDisconnect reply{m.remote, m.local, true};
  if (from.local) {
    e.local_inbox.emplace_back(0, reply);
    wake_engine(e);
  } else if (e.answering_session != 0) {
    e.channel.send(e.answering_session, reply);
  }
}

bool send_cm_disconnects(Engine& e) {
  const std::uint64_t now = monotonic_ns();
  std::erase_if(e.cm_pending, [&](VirtualQp* qp) {
    Protection* p = find(e, qp);
    return p == nullptr || p->cm.answered || now >= p->cm.until_ns;
  });
  for (VirtualQp* qp : e.cm_pending) {
    Protection& p = *find(e, qp);
    if (now < p.cm.next_send_ns) continue;
    const int routes =
        send_on_every_route(e, p, CmDisconnect{p.local, p.remote, false}, p.cm.sends++);
    VF_LOG_DEBUG("qp {}: rdma_cm disconnect sent to the peer's shim on {} route(s)", qp->vqpn,
                 routes);
    p.cm.next_send_ns = now + kCmDisconnectResendNs;
  }
  return !e.cm_pending.empty();
}

void handle_cm_disconnect(Engine& e, Protection& p, const CmDisconnect& m) {
  if (m.is_reply) {
    if (p.cm.asked && !p.cm.answered) {
      p.cm.answered = true;
      e.cm_answered.notify_all();
    }
    return;
  }
  // Answered every time (a lost answer is asked again); acted on once.
  send_on_open_session(e, p, CmDisconnect{p.local, p.remote, true});
  if (p.cm.from_peer) return;
  p.cm.from_peer = true;
  VF_LOG_INFO("qp {}: the peer's application disconnected its rdma_cm connection; this "
              "application gets RDMA_CM_EVENT_DISCONNECTED from the shim unless the CM's own "
              "(whose request may travel over a dead path) comes within {} ms",
              p.qp->vqpn, kCmDisconnectGraceNs / 1'000'000);
  e.cm_disconnects_due.push_back({p.qp->app_qp, p.qp->vqpn, monotonic_ns() + kCmDisconnectGraceNs});
}

void run_cm_disconnect_handler(Engine& e, std::unique_lock<std::mutex>& lock) {
  if (e.cm_disconnects_due.empty()) return;
  const CmDisconnectHandler handler = e.cm_disconnect_handler;
  const std::uint64_t now = monotonic_ns();
  std::vector<Engine::CmDisconnectDue> due;
  std::erase_if(e.cm_disconnects_due, [&](const Engine::CmDisconnectDue& entry) {
    if (entry.due_ns > now) return false;
    due.push_back(entry);
    return true;
  });
  if (handler == nullptr || due.empty()) return;
  // The handler calls librdmacm, which may open a device (ibv_open_device, into the engine).
  lock.unlock();
  for (const Engine::CmDisconnectDue& entry : due) handler(entry.qp, entry.qpn);
  lock.lock();
}

}  // namespace vf::failover
