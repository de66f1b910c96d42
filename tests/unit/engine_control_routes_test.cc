// Issue 20 item 7, loss of the management network: the session a switch request went on can die
// without a sign (its network's link down), so a request still unanswered at its resend goes out
// on every route to the peer's shim (a session to each address it advertised, started without
// waiting), and the answer to a peer's message goes back on the session that message came on. The rig of
// tests/unit/engine_rig.h, its pair's peer in "another process": a ControlChannel of the test on
// loopback TCP (every 127.0.0.x is this host). Every wait is a bounded number of poll rounds.
#include <arpa/inet.h>
#include <poll.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/control_channel.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

constexpr std::uint64_t kPeerToken = 7;
constexpr int kRounds = 200;  // poll rounds of up to 50 ms: a bound, not a delay

std::uint32_t loopback(std::uint32_t last) {
  return htonl(0x7f000000u | last);
}

std::vector<std::uint32_t> peer_addresses() {
  std::vector<std::uint32_t> out;
  for (std::uint32_t last = 1; last <= 6; ++last) out.push_back(loopback(last));
  return out;
}

// The peer process's shim, reduced to its control channel: it records what arrives, and on which
// of its sessions.
struct PeerShim {
  vf::ControlChannel channel;
  std::vector<std::pair<std::uint64_t, vf::ControlMessage>> received;  // session, message

  PeerShim() {
    std::string error;
    REQUIRE(channel.listen(18720, 18759, error));
    vf::Hello hello;
    hello.process_token = kPeerToken;
    hello.pid = 4242;
    // Management network first, as a shim advertises them: find_by_token prefers that session.
    hello.addresses = peer_addresses();
    hello.port = channel.port();
    channel.set_hello(hello);
  }

  template <typename T>
  std::vector<std::uint64_t> sessions_of() const {
    std::vector<std::uint64_t> out;
    for (const auto& [session, message] : received) {
      if (std::holds_alternative<T>(message)) out.push_back(session);
    }
    return out;
  }
};

// One poll round over the engine's channel (its messages to the engine's handlers, as its thread
// does) and the peer's.
void pump(Engine& e, PeerShim& peer) {
  std::vector<pollfd> fds;
  e.channel.collect(fds);
  const std::size_t peer_first = fds.size();
  peer.channel.collect(fds);
  ::poll(fds.data(), fds.size(), 50);
  std::vector<pollfd> mine(fds.begin(), fds.begin() + static_cast<std::ptrdiff_t>(peer_first));
  std::vector<pollfd> theirs(fds.begin() + static_cast<std::ptrdiff_t>(peer_first), fds.end());
  e.channel.handle(
      mine, 0,
      [&](vf::ControlSession& s, vf::ControlMessage& m) { vf::failover::on_session_message(e, s, m); },
      [&](const vf::ControlSession& s) { vf::failover::on_session_closed(e, s); });
  peer.channel.handle(
      theirs, 0,
      [&](vf::ControlSession& s, vf::ControlMessage& m) {
        if (!std::holds_alternative<vf::Hello>(m)) peer.received.emplace_back(s.id, m);
      },
      [](const vf::ControlSession&) {});
}

template <typename T>
void pump_until(Engine& e, PeerShim& peer, std::size_t count) {
  for (int round = 0; round < kRounds && peer.sessions_of<T>().size() < count; ++round) pump(e, peer);
  REQUIRE(peer.sessions_of<T>().size() == count);
}

// The rig's pair, its peer now the PeerShim: six addresses advertised, a session open on the first.
void pair_with(Rig& rig, PeerShim& peer) {
  vf::Hello hello;
  hello.process_token = rig.e->token;
  hello.pid = 1;
  rig.e->channel.set_hello(hello);
  rig.p->peer = {};
  rig.p->peer.token = kPeerToken;
  rig.p->peer.port = peer.channel.port();
  rig.p->peer.addresses = peer_addresses();
  std::string error;
  rig.p->peer.session = rig.e->channel.connect(loopback(1), peer.channel.port(), 2000, error);
  REQUIRE(rig.p->peer.session != 0);
  for (int round = 0; round < kRounds; ++round) {
    const vf::ControlSession* s = rig.e->channel.find(rig.p->peer.session);
    if (s != nullptr && s->hello_received) break;
    pump(*rig.e, peer);
  }
  REQUIRE(rig.e->channel.find_by_token(kPeerToken) != nullptr);
}

}  // namespace

TEST_CASE("An unanswered switch request is repeated on every route to the peer, and the answer's "
          "route is used next",
          "[engine]") {
  Rig rig;
  PeerShim peer;
  pair_with(rig, peer);
  vf::failover::start_switch(*rig.e, *rig.p, vf::kStandby, vf::FailoverReason::kPortDown);
  REQUIRE(rig.p->sw.in_progress);
  pump_until<vf::FailoverRequest>(*rig.e, peer, 1);  // on the open session only

  // No answer (the session died without a sign, say): the resend goes on that session and on a
  // new one to each other address, up to kMaxRouteConnectsPerSend outgoing sessions to the peer
  // (the open one counts): .1 (open), .2, .3, .4.
  const std::size_t cap = vf::failover::kMaxRouteConnectsPerSend;
  const std::uint16_t port = peer.channel.port();
  rig.p->sw.request_sent_ns = 1;
  vf::failover::periodic_work(*rig.e);
  pump_until<vf::FailoverRequest>(*rig.e, peer, 1 + cap);
  std::vector<std::uint64_t> sessions = peer.sessions_of<vf::FailoverRequest>();
  CHECK(std::set<std::uint64_t>(sessions.begin(), sessions.end()).size() == cap);
  CHECK(rig.e->channel.find_by_endpoint(loopback(4), port) != nullptr);
  CHECK(rig.e->channel.find_by_endpoint(loopback(5), port) == nullptr);

  // The next resend: every route carries the request again, and no session more (the bound is
  // per peer, not per call).
  rig.p->sw.request_sent_ns = 1;
  vf::failover::periodic_work(*rig.e);
  pump_until<vf::FailoverRequest>(*rig.e, peer, 1 + 2 * cap);
  sessions = peer.sessions_of<vf::FailoverRequest>();
  CHECK(std::set<std::uint64_t>(sessions.begin(), sessions.end()).size() == cap);
  CHECK(rig.e->channel.find_by_endpoint(loopback(5), port) == nullptr);

  // A route closes (TCP gave up on it): the one after, starting one address further on each
  // resend, takes its place: .5, not .6.
  rig.e->channel.close(rig.e->channel.find_by_endpoint(loopback(2), port)->id);
  rig.p->sw.request_sent_ns = 1;
  vf::failover::periodic_work(*rig.e);  // third resend: rotation 2, from .3
  pump_until<vf::FailoverRequest>(*rig.e, peer, 1 + 3 * cap);
  CHECK(rig.e->channel.find_by_endpoint(loopback(5), port) != nullptr);
  CHECK(rig.e->channel.find_by_endpoint(loopback(6), port) == nullptr);
  sessions = peer.sessions_of<vf::FailoverRequest>();
  for (const auto& [session, message] : peer.received) {
    if (const auto* request = std::get_if<vf::FailoverRequest>(&message)) {
      CHECK(request->epoch == rig.p->sw.epoch);
    }
  }

  // The peer answers on one of the new routes: the switch finishes.
  vf::FailoverReply reply;
  reply.local = rig.p->remote;
  reply.remote = rig.p->local;
  reply.epoch = rig.p->sw.epoch;
  reply.target_path = vf::kStandby;
  REQUIRE(peer.channel.send(sessions.back(), reply));
  for (int round = 0; round < kRounds && rig.p->sw.in_progress; ++round) pump(*rig.e, peer);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.v->active_path() == vf::kStandby);
}

TEST_CASE("The answer to the peer's switch request goes back on the session the request came on",
          "[engine]") {
  Rig rig;
  PeerShim peer;
  pair_with(rig, peer);
  // A second session, to the peer's fourth address; the peer learns its end of it from a message.
  std::string error;
  const std::uint64_t second = rig.e->channel.connect(loopback(4), peer.channel.port(), 2000, error);
  REQUIRE(second != 0);
  REQUIRE(rig.e->channel.send(second, vf::MrQuery{0x77, {}}));
  pump_until<vf::MrQuery>(*rig.e, peer, 1);
  const std::uint64_t peer_end = peer.sessions_of<vf::MrQuery>().front();

  // The peer's request comes on that session (its first-address session, the one this side
  // would pick, may be dead): the answer must take the same way back.
  vf::FailoverRequest request = rig.request_from_peer(1);
  request.delivered_messages = 0;
  REQUIRE(peer.channel.send(peer_end, request));
  pump_until<vf::FailoverReply>(*rig.e, peer, 1);
  CHECK(peer.sessions_of<vf::FailoverReply>().front() == peer_end);
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.e->answering_session == 0);
}

TEST_CASE("A pair whose peer is in this process: a resend goes to the inbox once, no connection",
          "[engine]") {
  Rig rig;
  vf::failover::start_switch(*rig.e, *rig.p, vf::kStandby, vf::FailoverReason::kPortDown);
  REQUIRE(rig.sent<vf::FailoverRequest>().size() == 1);
  rig.e->local_inbox.clear();
  rig.p->peer.addresses = {loopback(1), loopback(2)};  // ignored for a local peer
  rig.p->peer.port = 18720;
  CHECK(vf::failover::send_on_every_route(*rig.e, *rig.p, vf::MrQuery{0x77, {}}, 0) == 1);
  CHECK(rig.e->local_inbox.size() == 1);
  CHECK(rig.e->channel.find_by_endpoint(loopback(1), 18720) == nullptr);
  CHECK(rig.e->channel.find_by_endpoint(loopback(2), 18720) == nullptr);
}

TEST_CASE("Every route: never this host's own addresses, never a session of another process",
          "[engine]") {
  Rig rig;
  PeerShim peer;
  pair_with(rig, peer);
  // This host also has .2 and .3 (a bridge address every host has, say): not routes to the peer.
  vf::Hello mine = rig.e->channel.hello();
  mine.addresses = {loopback(2), loopback(3)};
  rig.e->channel.set_hello(mine);
  const std::uint16_t port = peer.channel.port();
  CHECK(vf::failover::send_on_every_route(*rig.e, *rig.p, vf::MrQuery{0x77, {}}, 0) == 4);
  CHECK(rig.e->channel.find_by_endpoint(loopback(2), port) == nullptr);
  CHECK(rig.e->channel.find_by_endpoint(loopback(3), port) == nullptr);
  pump_until<vf::MrQuery>(*rig.e, peer, 4);  // .1 (open), .4, .5, .6

  // While a message of another process (another token) is handled, what goes to the peer still
  // goes to the peer, not back on that process's session.
  PeerShim stranger;
  vf::Hello other = stranger.channel.hello();
  other.process_token = 99;
  stranger.channel.set_hello(other);
  std::string error;
  const std::uint64_t to_stranger = rig.e->channel.connect(loopback(1), stranger.channel.port(), 2000, error);
  REQUIRE(to_stranger != 0);
  for (int round = 0; round < kRounds && !rig.e->channel.find(to_stranger)->hello_received; ++round) {
    pump(*rig.e, stranger);
  }
  REQUIRE(rig.e->channel.find(to_stranger)->hello_received);
  rig.e->answering_session = to_stranger;  // as if handling a message of the stranger
  REQUIRE(vf::failover::send_on_open_session(*rig.e, *rig.p, vf::MrQuery{0x78, {}}));
  rig.e->answering_session = 0;
  for (int round = 0; round < 20; ++round) pump(*rig.e, stranger);
  pump_until<vf::MrQuery>(*rig.e, peer, 5);
  CHECK(stranger.received.empty());
}

TEST_CASE("Every route: an address the peer lists twice gets one session", "[engine]") {
  Rig rig;
  PeerShim peer;
  pair_with(rig, peer);
  rig.p->peer.addresses = {loopback(1), loopback(2), loopback(2), loopback(3)};
  CHECK(vf::failover::send_on_every_route(*rig.e, *rig.p, vf::MrQuery{0x77, {}}, 0) == 3);
  pump_until<vf::MrQuery>(*rig.e, peer, 3);  // .1 (open), .2, .3
  for (int round = 0; round < 10; ++round) pump(*rig.e, peer);
  CHECK(peer.sessions_of<vf::MrQuery>().size() == 3);
}
