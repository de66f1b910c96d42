#include "core/failover/message_dispatch.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/cm_disconnect.h"
#include "core/failover/pair_end.h"
#include "core/failover/pairing.h"
#include "core/failover/protection_status.h"
#include "core/failover/path_recovery.h"
#include "core/failover/path_switch.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

// The session a message to the pair's peer process goes on, or null: while a message of that
// peer is handled, the session it came on; else its preferred live session (find_by_token),
// else the one the pairing used.
ControlSession* open_session_for(Engine& e, const Protection& p) {
  if (e.answering_session != 0) {
    ControlSession* session = e.channel.find(e.answering_session);
    if (session != nullptr && session->hello_received &&
        session->peer.process_token == p.peer.token) {
      return session;
    }
  }
  if (ControlSession* session = e.channel.find_by_token(p.peer.token)) return session;
  return e.channel.find(p.peer.session);
}

}  // namespace

bool send_on_open_session(Engine& e, Protection& p, const ControlMessage& message) {
  if (p.peer.local) {
    e.local_inbox.emplace_back(0, message);
    wake_engine(e);
    return true;
  }
  ControlSession* session = open_session_for(e, p);
  return session != nullptr && e.channel.send(session->id, message);
}

int send_on_every_route(Engine& e, Protection& p, const ControlMessage& message,
                        std::size_t rotation) {
  if (p.peer.local) return send_on_open_session(e, p, message) ? 1 : 0;
  int routes = 0;
  std::uint64_t used = 0;
  if (ControlSession* session = open_session_for(e, p)) {
    used = session->id;
    if (e.channel.send(used, message)) ++routes;
  }
  if (p.peer.port == 0) return routes;  // a peer without a listener: no other route
  const std::vector<std::uint32_t>& own = e.channel.hello().addresses;
  const std::size_t n = p.peer.addresses.size();
  // The outgoing sessions to the peer's addresses, existing or started here, are bounded per
  // peer (not per call: every QP of a switch calls this): a peer that advertises many
  // addresses, or one that is gone, costs at most kMaxRouteConnectsPerSend of them.
  // Session ids, not pointers: a send that fails closes its session (and frees it).
  std::vector<std::pair<std::uint32_t, std::uint64_t>> routes_found;  // address, session (0: none)
  std::size_t outgoing = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t address = p.peer.addresses[(rotation + i) % n];
    const auto listed = [&](const auto& route) { return route.first == address; };
    if (std::any_of(routes_found.begin(), routes_found.end(), listed)) continue;  // listed twice
    ControlSession* session = e.channel.find_by_endpoint(address, p.peer.port);
    if (session != nullptr) ++outgoing;
    routes_found.emplace_back(address, session != nullptr ? session->id : 0);
  }
  for (const auto& [address, id] : routes_found) {
    ControlSession* session = nullptr;
    if (id != 0) {
      session = e.channel.find(id);
      if (session == nullptr) continue;  // closed since (a send on it failed)
    } else {
      // Never this host's own address (a bridge address every host has, say): it leads here.
      if (std::find(own.begin(), own.end(), address) != own.end()) continue;
      if (outgoing >= static_cast<std::size_t>(kMaxRouteConnectsPerSend)) continue;
      std::string error;
      const std::uint64_t started =
          e.channel.connect_async(address, p.peer.port, kConnectTimeoutMs, error);
      if (started == 0) {  // no route from here (this host's link to that network is down)
        VF_LOG_DEBUG("control: no route to {}:{} ({})", ipv4_text(address), p.peer.port, error);
        continue;
      }
      ++outgoing;
      session = e.channel.find(started);
    }
    if (session == nullptr || session->id == used) continue;
    // A session whose far end said it is another process is not a route to this peer.
    if (session->hello_received && session->peer.process_token != p.peer.token) continue;
    if (e.channel.send(session->id, message)) ++routes;
  }
  return routes;
}

bool send_to_peer(Engine& e, Protection& p, const ControlMessage& message) {
  if (send_on_open_session(e, p, message)) {
    if (!p.peer.local) p.peer_unreachable_reported = false;
    return true;
  }
  // Every session to the peer is gone: reach it on any address it advertised.
  for (std::uint32_t address : p.peer.addresses) {
    std::string error;
    const std::uint64_t id = e.channel.connect(address, p.peer.port, kConnectTimeoutMs, error);
    if (id == 0) {
      VF_LOG_DEBUG("control: reconnect to {}:{} failed ({})", ipv4_text(address), p.peer.port,
                   error);
      continue;
    }
    p.peer.session = id;
    if (e.channel.send(id, message)) return true;
  }
  if (!p.peer_unreachable_reported) {  // once, not at every retry
    p.peer_unreachable_reported = true;
    VF_LOG_ERROR("qp {}: the peer's shim (pid {}) cannot be reached on any of its addresses",
                 p.qp->vqpn, p.peer.pid);
  }
  return false;
}

void flush_outbox(Engine& e) {
  auto outbox = std::move(e.outbox);
  e.outbox.clear();
  for (auto& [v, message] : outbox) {
    auto it = e.protections.find(v);
    if (it == e.protections.end() || it->second.destroyed) continue;
    send_to_peer(e, it->second, message);
  }
}

namespace {

// Whether `from` is the process the pair was paired with: this process for a pair whose ends
// are both here, otherwise the process of the peer's token, over the network.
bool from_pairs_peer(const Protection& p, const PeerRef& from) {
  if (p.peer.local) return from.local;
  return !from.local && from.token != 0 && from.token == p.peer.token;
}

void drop_foreign(Engine& e, const PeerRef& from, std::string_view type, const QpKey& about,
                  std::string_view why) {
  const std::uint64_t n = ++e.foreign_messages;
  if ((n & (n - 1)) != 0) return;  // a power of two: 1st, 2nd, 4th...
  VF_LOG_WARN("control: {} about qp {} from {} (pid {}) dropped: {} ({} such message(s) so far)",
              type, about.qpn, from.local ? std::string("this process") : fmt::format("{:#x}", from.token),
              from.pid, why, n);
}

// The pair a message names, if it came from that pair's peer about that very pair: `ours` is
// our QP's key, `theirs` the sender's own QP. Anything else is dropped with a (bounded) log
// line: the peer's shim never sends it, so it is stale at best.
Protection* pair_for(Engine& e, const PeerRef& from, std::string_view type, const QpKey& ours,
                     const QpKey& theirs) {
  Protection* p = protection_by_key(e, ours);
  if (p == nullptr) return nullptr;  // a QP destroyed since: its peer's late messages end here
  if (!p->paired || p->destroyed) {
    drop_foreign(e, from, type, ours, "the QP is not paired");
    return nullptr;
  }
  if (!from_pairs_peer(*p, from)) {
    drop_foreign(e, from, type, ours, "not from the process the QP is paired with");
    return nullptr;
  }
  if (!(p->remote == theirs)) {
    drop_foreign(e, from, type, ours, fmt::format("about its qp {}, the pair's is qp {}",
                                                  theirs.qpn, p->remote.qpn));
    return nullptr;
  }
  return p;
}

// A pairing's answer (PairReply, PairRefused) counts only on the session its request went on.
bool answers_our_request(Engine& e, const PeerRef& from, std::uint64_t session,
                         std::string_view type, const QpKey& ours) {
  Protection* p = protection_by_key(e, ours);
  if (p == nullptr || p->paired || !p->pairing) return true;  // the handler ignores it
  if (from.local || (session != 0 && session == p->awaiting_session)) return true;
  drop_foreign(e, from, type, ours, "not on the session the pairing request went on");
  return false;
}

}  // namespace

void process_message(Engine& e, const PeerRef& from, std::uint64_t session,
                     ControlMessage& message) {
  if (auto* m = std::get_if<PairRequest>(&message)) {
    // A paired QP is asked again only by its own peer (crossed requests of one pairing).
    if (Protection* p = protection_by_key(e, m->remote);
        p != nullptr && p->paired && !from_pairs_peer(*p, from)) {
      return drop_foreign(e, from, "PairRequest", m->remote,
                          "the QP is paired with another process");
    }
    return handle_pair_request(e, from, session, *m);
  }
  if (auto* m = std::get_if<PairReply>(&message)) {
    if (!answers_our_request(e, from, session, "PairReply", m->pair.remote)) return;
    return handle_pair_reply(e, from, session, *m);
  }
  if (auto* m = std::get_if<PairRefused>(&message)) {
    if (!answers_our_request(e, from, session, "PairRefused", m->remote)) return;
    return handle_pair_refused(e, *m);
  }
  if (auto* m = std::get_if<MrUpdate>(&message)) return handle_mr_update(e, from, *m);
  if (auto* m = std::get_if<MrQuery>(&message)) return handle_mr_query(e, from, session, *m);
  if (auto* m = std::get_if<FailoverRequest>(&message)) {
    if (pair_for(e, from, "FailoverRequest", m->remote, m->local) == nullptr) return;
    return handle_failover(e, m->remote, m->delivered_messages, m->epoch, m->target_path, true,
                           static_cast<FailoverReason>(m->reason));
  }
  if (auto* m = std::get_if<FailoverReply>(&message)) {
    if (pair_for(e, from, "FailoverReply", m->remote, m->local) == nullptr) return;
    return handle_failover(e, m->remote, m->delivered_messages, m->epoch, m->target_path, false,
                           FailoverReason::kPeerRequest);
  }
  if (auto* m = std::get_if<vf::Rearm>(&message)) {
    if (pair_for(e, from, "Rearm", m->remote, m->local) == nullptr) return;
    return handle_rearm(e, *m);
  }
  if (auto* m = std::get_if<PathStatus>(&message)) {
    if (pair_for(e, from, "PathStatus", m->remote, m->local) == nullptr) return;
    return handle_path_status(e, *m);
  }
  if (auto* m = std::get_if<PairEnded>(&message)) {
    Protection* p = pair_for(e, from, "PairEnded", m->remote, m->local);
    if (p == nullptr) return;
    return handle_pair_ended(e, *p);
  }
  if (auto* m = std::get_if<CmDisconnect>(&message)) {
    if (protection_by_key(e, m->remote) == nullptr) {
      if (!m->is_reply) answer_unknown_cm_disconnect(e, from, *m);
      return;
    }
    Protection* p = pair_for(e, from, "CmDisconnect", m->remote, m->local);
    if (p == nullptr) return;
    return handle_cm_disconnect(e, *p, *m);
  }
}

void on_session_message(Engine& e, ControlSession& session, ControlMessage& message) {
  if (std::holds_alternative<Hello>(message)) return on_hello(e, session);
  PeerRef from;
  from.token = session.peer.process_token;
  from.addresses = session.peer.addresses;
  from.port = session.peer.port;
  from.pid = session.peer.pid;
  from.session = session.id;
  e.answering_session = session.id;
  process_message(e, from, session.id, message);
  e.answering_session = 0;
}

void on_session_closed(Engine& e, const ControlSession& closed) {
  VF_LOG_DEBUG("control: session with {}:{} closed", ipv4_text(closed.remote_address),
               closed.remote_port);
  for (auto& [key, p] : e.protections) {
    if (p.destroyed) continue;
    if (p.pairing && p.awaiting_session == closed.id) {
      p.awaiting_session = 0;
      try_next_candidate(e, p);
    }
  }
}

void on_hello(Engine& e, ControlSession& session) {
  if (!session.outgoing || session.peer.addresses.empty()) return;
  const std::uint32_t best = session.peer.addresses.front();
  if (best == session.remote_address) return;
  if (e.channel.find_by_endpoint(best, session.peer.port) != nullptr) return;
  std::string error;
  const std::uint16_t port = session.peer.port;
  if (e.channel.connect_async(best, port, kConnectTimeoutMs, error) == 0) {
    VF_LOG_DEBUG("control: no second session to {}:{} ({})", ipv4_text(best), port, error);
  }
}

}  // namespace vf::failover
