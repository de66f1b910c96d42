#include "core/failover/pairing.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/pair_end.h"
#include "core/failover/protection_status.h"
#include "core/failover/qp_transitions.h"
#include "core/failover/srq_group.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

PairRequest describe_standby(Engine& e, Protection& p) {
  PairRequest request;
  request.local = p.local;
  request.remote = p.remote;
  const PhysicalPath& standby = p.qp->path[kStandby];
  request.standby_qpn = standby.qp->qp_num;
  request.standby_gid = standby.gid;
  request.standby_psn = standby.psn;
  request.path_mtu = static_cast<std::uint8_t>(standby_mtu(e, p));
  const ibv_ece& ece = primary_ece(e, p);
  request.ece_vendor_id = ece.vendor_id;
  request.ece_options = ece.vendor_id != 0 ? ece.options : 0;
  // The registrations of the QP's device: the peer translates our rkeys with them.
  request.registrations = mirrored_registrations(
      e, kMaxRegistrationsPerMessage, [&](const ibv_mr&, const MrRecord& record) {
        return record.device == p.qp->path[kPrimary].device_index;
      });
  return request;
}

// The standby pair is connected from the peer's description (request or reply).
bool accept_peer_standby(Engine& e, Protection& p, const PairRequest& theirs) {
  if (p.paired) return true;
  p.standby_ece = agree_ece(primary_ece(e, p), theirs);
  if (p.primary_ece.vendor_id != 0 && p.standby_ece.vendor_id == 0) {
    VF_LOG_INFO("qp {}: the standby pair runs without ECE: the peer's primary has {}", p.qp->vqpn,
                theirs.ece_vendor_id == 0
                    ? std::string("none")
                    : fmt::format("vendor {:#x}, not {:#x}", theirs.ece_vendor_id,
                                  p.primary_ece.vendor_id));
  }
  if (!connect_standby(e, p, theirs.standby_qpn, theirs.standby_gid, theirs.standby_psn,
                       theirs.path_mtu)) {
    set_unprotected(p, "the standby QP could not be connected");
    return false;
  }
  if (!p.peer.local) learn_translations(e, p.qp->peer, theirs.registrations);
  mark_protected(e, p);
  return true;
}

// Pairing failed for good: the QP runs pass-through, and so does an SRQ it takes receives from
// (the SRQ could not move without it).
void pairing_failed(Engine& e, Protection& p, std::string reason) {
  p.pairing = false;
  if (SrqGroup* group = group_of(e, *p.qp)) {
    pin_srq_group(e, *group, fmt::format("qp {} on it could not be paired", p.qp->vqpn));
  }
  set_unprotected(p, std::move(reason));
}

}  // namespace

void handle_pair_request(Engine& e, const PeerRef& from, std::uint64_t session,
                         const PairRequest& request) {
  Protection* p = protection_by_key(e, request.remote);
  auto refuse = [&](PairRefusal reason) {
    PairRefused refused{request.remote, request.local, static_cast<std::uint32_t>(reason)};
    if (from.local) {
      e.local_inbox.emplace_back(0, refused);
    } else {
      e.channel.send(session, refused);
    }
  };
  if (p == nullptr) return refuse(PairRefusal::kUnknownQp);
  if (p->qp->path[kStandby].qp == nullptr || p->qp->mode() == PostMode::kBypass ||
      p->qp->application_failed.load() || p->ended) {
    return refuse(PairRefusal::kUnprotected);
  }
  p->peer = from;
  if (!from.local) p->peer.session = session;
  p->qp->peer = peer_index(e, from.token, request.local.gid);
  if (!p->remote_known) {
    p->remote = request.local;
    p->remote_known = true;
  }
  if (!accept_peer_standby(e, *p, request)) return refuse(PairRefusal::kUnprotected);
  PairReply reply{describe_standby(e, *p)};
  if (from.local) {
    e.local_inbox.emplace_back(0, reply);
    wake_engine(e);
  } else {
    e.channel.send(session, reply);
  }
}

void handle_pair_reply(Engine& e, const PeerRef& from, std::uint64_t session,
                       const PairReply& reply) {
  Protection* p = protection_by_key(e, reply.pair.remote);
  if (p == nullptr || p->paired) return;
  if (p->ended || p->qp->application_failed.load()) {
    // A pairing stopped since (the application's QP failed or was taken down): the peer has
    // paired its end with ours, so it is told that the pair is over (else its requests would
    // wait for answers that never come). Known as its peer for that, never protected.
    p->peer = from;
    if (!from.local) p->peer.session = session;
    p->paired = true;
    p->pairing = false;
    answer_pair_ended(e, *p);
    return;
  }
  p->peer = from;
  if (!from.local) p->peer.session = session;
  p->qp->peer = peer_index(e, from.token, reply.pair.local.gid);
  accept_peer_standby(e, *p, reply.pair);
}

void handle_pair_refused(Engine& e, const PairRefused& refused) {
  Protection* p = protection_by_key(e, refused.remote);
  if (p == nullptr || p->paired || !p->pairing) return;
  if (refused.reason == static_cast<std::uint32_t>(PairRefusal::kUnprotected)) {
    pairing_failed(e, *p, "the peer's shim has no standby for its QP (no backup device there)");
    return;
  }
  p->awaiting_session = 0;
  try_next_candidate(e, *p);
}

bool pair_locally(Engine& e, Protection& p) {
  Protection* other = protection_by_key(e, p.remote);
  if (other == nullptr) return false;
  PeerRef self;
  self.local = true;
  p.peer = self;
  other->peer = self;
  p.self_connected = other == &p;
  p.qp->peer = local_peer_index(other->qp->path[kPrimary].device_index);
  other->qp->peer = local_peer_index(p.qp->path[kPrimary].device_index);
  if (other->qp->path[kStandby].qp == nullptr || other->qp->mode() == PostMode::kBypass ||
      other->ended || other->qp->application_failed.load() || p.ended ||
      p.qp->application_failed.load()) {
    p.pairing = false;
    set_unprotected(p, "its peer QP in this process is unprotected");
    return true;
  }
  if (!other->remote_known) {
    other->remote = p.local;
    other->remote_known = true;
  }
  const PairRequest mine = describe_standby(e, p);
  const PairRequest theirs = describe_standby(e, *other);
  if (other != &p) accept_peer_standby(e, *other, mine);
  accept_peer_standby(e, p, theirs);
  return true;
}

void try_next_candidate(Engine& e, Protection& p) {
  while (p.next_candidate < p.candidates.size()) {
    const auto [address, port] = p.candidates[p.next_candidate++];
    ControlSession* session = e.channel.find_by_endpoint(address, port);
    std::uint64_t id = session != nullptr ? session->id : 0;
    if (id == 0) {
      // Not waited for: a connection that fails later closes its session, and the close
      // handler moves on to the next candidate.
      std::string error;
      id = e.channel.connect_async(address, port, kConnectTimeoutMs, error);
      if (id == 0) continue;  // refused at once
    }
    if (!e.channel.send(id, describe_standby(e, p))) continue;
    p.awaiting_session = id;
    p.awaiting_since_ns = monotonic_ns();
    return;
  }
  // Nobody answered for this QP: the peer may not run the shim, or not be reachable.
  p.awaiting_session = 0;
  if (++p.pairing_rounds < kPairingRounds) {
    // 0.5, 1, 2, 4, 8 s: a peer process that starts late still pairs.
    p.retry_at_ns = monotonic_ns() + (500'000'000ull << (p.pairing_rounds - 1));
    p.next_candidate = 0;
    return;
  }
  pairing_failed(e, p,
                 "no peer shim answered for it (is the peer running verbs-failover, and is "
                 "the control port reachable? VERBS_FAILOVER_CTRL_ADDRS)");
}

void start_pairing(Engine& e, Protection& p) {
  p.pairing = true;
  p.pairing_rounds = 0;
  p.next_candidate = 0;
  if (pair_locally(e, p)) return;
  p.candidates.clear();
  std::vector<std::uint32_t> addresses;
  if (const std::uint32_t address = ipv4_of_gid(p.remote.gid); address != 0) {
    addresses.push_back(address);
  }
  for (const std::string& text : e.config.ctrl_peer_addresses) {
    in_addr parsed{};
    if (inet_pton(AF_INET, text.c_str(), &parsed) == 1) addresses.push_back(parsed.s_addr);
  }
  if (addresses.empty()) {
    p.pairing = false;
    set_unprotected(p,
                    "the peer's GID holds no IPv4 address and VERBS_FAILOVER_CTRL_ADDRS names "
                    "no peer address");
    return;
  }
  for (std::uint32_t address : addresses) {
    for (std::uint32_t port = e.config.ctrl_port_first; port <= e.config.ctrl_port_last; ++port) {
      p.candidates.emplace_back(address, static_cast<std::uint16_t>(port));
    }
  }
  try_next_candidate(e, p);
}

}  // namespace vf::failover
