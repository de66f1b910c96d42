// The failover engine's rooms (core/failover/) driven one handler at a time, on the rig of
// tests/unit/engine_rig.h (no thread, no socket, no device). Each case hands one crafted message
// or event to the function that owns it and checks the state it changed, and what it left alone.
#include "core/clock.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

TEST_CASE("FailoverRequest with the next epoch switches this side and answers with its count",
          "[engine]") {
  Rig rig;
  rig.deliver(rig.request_from_peer(1));
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->epoch == 1);
  CHECK(rig.p->failovers == 1);
  REQUIRE(rig.p->events.size() == 1);
  CHECK(std::string(rig.p->events[0].reason) == "peer_request");
  // The old path stopped (ERR), then reset for a later re-arm (RESET, INIT); the standby untouched.
  REQUIRE(g_modifies.size() == 3);
  CHECK(g_modifies[0].qp == &rig.app_qp);
  CHECK(g_modifies[0].state == IBV_QPS_ERR);
  CHECK(g_modifies[1].state == IBV_QPS_RESET);
  CHECK(g_modifies[2].state == IBV_QPS_INIT);
  CHECK(rig.p->rearm[vf::kPrimary].needed);
  // The application keeps reading the state it set.
  CHECK(rig.app_qp.state == IBV_QPS_RTS);
  const auto replies = rig.sent<vf::FailoverReply>();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].epoch == 1);
  CHECK(replies[0].target_path == vf::kStandby);
  CHECK(replies[0].delivered_messages == 0);
  CHECK(replies[0].local == rig.p->local);
}

TEST_CASE("The replay is exactly what the peer did not deliver", "[engine]") {
  Rig rig;
  rig.post_send(0x51);
  REQUIRE(g_posts.size() == 1);  // on the primary, as the application posted it
  CHECK(g_posts[0].qp == &rig.app_qp);
  auto request = rig.request_from_peer(1);
  SECTION("delivered: completed as proven done, not sent again") {
    request.delivered_messages = 1;
    rig.deliver(request);
    CHECK(rig.v->counters.replayed_wrs.load() == 0);
    CHECK(rig.v->counters.synthesized_completions.load() == 1);
    CHECK(g_posts.size() == 1);
    ibv_wc wc{};
    REQUIRE(rig.cq_state->stash.pop(1, &wc) == 1);
    CHECK(wc.wr_id == 0x51);
    CHECK(wc.status == IBV_WC_SUCCESS);
  }
  SECTION("not delivered: sent again on the standby, once") {
    request.delivered_messages = 0;
    rig.deliver(request);
    CHECK(rig.v->counters.replayed_wrs.load() == 1);
    CHECK(rig.v->counters.synthesized_completions.load() == 0);
    REQUIRE(g_posts.size() == 2);
    CHECK(g_posts[1].qp == &rig.standby_qp);
    CHECK(rig.cq_state->stash.size() == 0);
  }
}

TEST_CASE("FailoverRequest for a silent failure holds the path down while its port is ACTIVE",
          "[engine]") {
  Rig rig;
  auto request = rig.request_from_peer(1);
  request.reason = static_cast<std::uint32_t>(vf::FailoverReason::kErrorCompletion);
  SECTION("port ACTIVE: held down, reported unprotected") {
    rig.deliver(request);
    CHECK(rig.v->active_path() == vf::kStandby);
    CHECK(rig.p->hold[vf::kPrimary].until_ns != 0);
    CHECK(rig.p->unprotected_reason.find("held down") != std::string::npos);
  }
  SECTION("port down: the port explains it, no hold") {
    g_port_state = IBV_PORT_DOWN;
    rig.deliver(request);
    CHECK(rig.v->active_path() == vf::kStandby);
    CHECK(rig.p->hold[vf::kPrimary].until_ns == 0);
  }
}

TEST_CASE("FailoverRequest with a stale epoch, or a reply to no switch, changes nothing",
          "[engine]") {
  Rig rig;
  rig.p->epoch = 3;
  rig.deliver(rig.request_from_peer(3));
  rig.deliver(rig.request_from_peer(2));
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 4, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK(rig.v->mode() == vf::PostMode::kDirect);
  CHECK(rig.p->epoch == 3);
  CHECK(rig.p->failovers == 0);
  CHECK(g_modifies.empty());
  CHECK(rig.e->local_inbox.empty());
}

TEST_CASE("A port down under the active path starts the switch and asks the peer", "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  CHECK(rig.v->path[vf::kPrimary].failed);
  CHECK(rig.p->sw.in_progress);  // waits for the peer's count
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.v->mode() == vf::PostMode::kRouted);
  const auto requests = rig.sent<vf::FailoverRequest>();
  REQUIRE(requests.size() == 1);
  CHECK(requests[0].epoch == 1);
  CHECK(requests[0].reason == static_cast<std::uint32_t>(vf::FailoverReason::kPortDown));
  CHECK(requests[0].target_path == vf::kStandby);
  // The peer's reply finishes it.
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 1, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->failovers == 1);
  CHECK(rig.p->unprotected_reason.find("port fake0/1 is down") != std::string::npos);
}

TEST_CASE("A port down under the idle standby reports the QP unprotected, no switch", "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 1, 1, IBV_PORT_DOWN);
  CHECK(rig.v->path[vf::kStandby].failed);
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->rearm[vf::kStandby].needed);
  CHECK(rig.p->unprotected_reason.find("standby path's port fake1/1 is down") != std::string::npos);
  CHECK(g_modifies.empty());
  const auto notices = rig.sent<vf::PathStatus>();
  REQUIRE(notices.size() == 1);  // the peer is told (its side of the path looks fine)
  CHECK(notices[0].path == vf::kStandby);
  CHECK_FALSE(notices[0].up);
}

TEST_CASE("PathStatus: the peer's end of the idle standby lost its port", "[engine]") {
  Rig rig;
  vf::PathStatus status;
  status.local = rig.p->remote;
  status.remote = rig.p->local;
  status.path = vf::kStandby;
  status.up = false;
  SECTION("from the pair's peer: the path is failed and the QP unprotected") {
    vf::failover::handle_path_status(*rig.e, status);
    CHECK(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->rearm[vf::kStandby].needed);
    CHECK(rig.p->unprotected_reason.find("the peer's end of its standby path failed") != std::string::npos);
  }
  SECTION("from an earlier pair of a reused QP number: ignored") {
    status.local.qpn = 99;
    vf::failover::handle_path_status(*rig.e, status);
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->unprotected_reason.empty());
  }
}

TEST_CASE("Rearm: a request for a path that is held down is not answered", "[engine]") {
  Rig rig;
  rig.v->path[vf::kStandby].connected = false;
  rig.p->rearm[vf::kStandby].needed = true;
  rig.p->hold[vf::kStandby].until_ns = ~0ull;
  vf::Rearm request;
  request.local = rig.p->remote;
  request.remote = rig.p->local;
  request.path = vf::kStandby;
  request.nonce = 3;
  vf::failover::handle_rearm(*rig.e, request);
  CHECK(rig.p->rearm[vf::kStandby].seen_nonce == 3);
  CHECK(rig.p->rearm[vf::kStandby].answered_nonce == 0);
  CHECK_FALSE(rig.v->path[vf::kStandby].connected);
  CHECK(g_modifies.empty());
  CHECK(rig.e->local_inbox.empty());
}

TEST_CASE("PairRefused for want of a standby ends the pairing with the reason", "[engine]") {
  Rig rig;
  rig.p->paired = false;
  rig.p->pairing = true;
  vf::PairRefused refused{rig.p->remote, rig.p->local,
                          static_cast<std::uint32_t>(vf::PairRefusal::kUnprotected)};
  vf::failover::handle_pair_refused(*rig.e, refused);
  CHECK_FALSE(rig.p->pairing);
  CHECK_FALSE(rig.p->paired);
  CHECK(rig.p->unprotected_reason.find("no standby") != std::string::npos);
}

// Issue 19 item 12: a message about a pair is acted on only when it comes from that pair's peer:
// the process the QP was paired with (its token), over the control channel, about the very pair
// (its own QP key and ours). Anything else is dropped, whatever the QP numbers it names.
TEST_CASE("Messages about a pair from anyone but its peer change nothing", "[engine]") {
  Rig rig;
  rig.p->peer = {};
  rig.p->peer.token = 7;  // paired with another process
  vf::failover::PeerRef stranger;
  stranger.token = 99;
  stranger.session = 5;
  vf::failover::PeerRef peer;
  peer.token = 7;
  peer.session = 6;
  const std::vector<std::uint64_t> no_posts;
  SECTION("FailoverRequest from another process: no switch") {
    vf::ControlMessage m = rig.request_from_peer(1);
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
    CHECK(rig.p->epoch == 0);
    CHECK(g_modifies.empty());
  }
  SECTION("FailoverRequest from the peer naming another QP of its own: no switch") {
    vf::FailoverRequest request = rig.request_from_peer(1);
    request.local.qpn = 34;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, peer, peer.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
  }
  SECTION("FailoverRequest from a local pair's stand-in over the network: no switch") {
    rig.p->peer = {};
    rig.p->peer.local = true;
    vf::ControlMessage m = rig.request_from_peer(1);
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.v->active_path() == vf::kPrimary);
  }
  SECTION("FailoverReply from another process does not finish a switch") {
    // Begun while the rig's peer is this process (so the request is "sent"), then the peer is
    // the other process again for the answers.
    rig.p->peer = {};
    rig.p->peer.local = true;
    vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
    REQUIRE(rig.p->sw.in_progress);
    rig.p->peer = {};
    rig.p->peer.token = 7;
    vf::FailoverReply reply;
    reply.local = rig.p->remote;
    reply.remote = rig.p->local;
    reply.epoch = rig.p->sw.epoch;
    reply.target_path = vf::kStandby;
    reply.delivered_messages = 1000;  // would make undelivered work look delivered
    vf::ControlMessage m = reply;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->sw.peer_known);
    CHECK(rig.p->sw.in_progress);
    // The peer's own reply still finishes it.
    reply.delivered_messages = 0;
    m = reply;
    vf::failover::process_message(*rig.e, peer, peer.session, m);
    CHECK_FALSE(rig.p->sw.in_progress);
    CHECK(rig.p->failovers == 1);
  }
  SECTION("PairEnded from another process: the pair stays protected") {
    vf::ControlMessage m = vf::PairEnded{rig.p->remote, rig.p->local};
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.p->ended);
    CHECK(rig.p->unprotected_reason.empty());
  }
  SECTION("PathStatus from another process: the standby stays in use") {
    vf::PathStatus status;
    status.local = rig.p->remote;
    status.remote = rig.p->local;
    status.path = vf::kStandby;
    vf::ControlMessage m = status;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
    CHECK(rig.p->unprotected_reason.empty());
  }
  SECTION("Rearm from another process: the standby is not re-connected anywhere") {
    rig.v->path[vf::kStandby].connected = false;
    rig.p->rearm[vf::kStandby].needed = true;
    vf::Rearm request = rig.rearm_from_peer(vf::kStandby, 3);
    request.qpn = 4242;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->rearm[vf::kStandby].seen_nonce == 0);
    CHECK_FALSE(rig.v->path[vf::kStandby].connected);
    CHECK(g_modifies.empty());
  }
  SECTION("PairRefused on another session than the request's: the pairing goes on") {
    rig.p->paired = false;
    rig.p->pairing = true;
    rig.p->awaiting_session = 6;
    vf::PairRefused refused{rig.p->remote, rig.p->local,
                            static_cast<std::uint32_t>(vf::PairRefusal::kUnprotected)};
    vf::ControlMessage m = refused;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->pairing);
    CHECK(rig.p->unprotected_reason.empty());
  }
  SECTION("PairRequest on a paired QP from another process: the pair keeps its peer") {
    vf::PairRequest request;
    request.local = {55, gid(9)};
    request.remote = rig.p->local;
    vf::ControlMessage m = request;
    vf::failover::process_message(*rig.e, stranger, stranger.session, m);
    CHECK(rig.p->peer.token == 7);
    CHECK(rig.p->remote.qpn == 33);
    CHECK(rig.sent<vf::PairReply>().empty());
  }
}

// Issue 19 item 12: a switch that cannot complete (the peer never answers) shows the application
// what its QP in ERR would have: every request posted during the attempt, which reached no QP,
// completes with IBV_WC_WR_FLUSH_ERR, signaled or not (a device reports every flushed WR, so
// that its owner can reclaim the buffers; rxe's flush_send_queue, mlx5 alike).
TEST_CASE("A switch given up flushes every request posted during it, unsignaled ones too",
          "[engine]") {
  Rig rig;
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->sw.in_progress);
  rig.post_send(1);
  rig.post_send(2, false);
  rig.post_send(3, false);
  rig.post_send(4);
  CHECK(g_posts.empty());  // held: the switch is not done
  vf::failover::abort_switch(*rig.p, "test: the peer never answered");
  ibv_wc wc[8]{};
  const int n = rig.cq_state->poll(8, wc);
  REQUIRE(n == 4);
  for (int i = 0; i < n; ++i) {
    CHECK(wc[i].wr_id == static_cast<std::uint64_t>(i + 1));
    CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wc[i].opcode == IBV_WC_SEND);
    CHECK(wc[i].qp_num == 17);
  }
  CHECK(rig.cq_state->poll(8, wc) == 0);
  CHECK(rig.v->mode() == vf::PostMode::kBypass);
}

// Issue 19 item 12b: an application that asked for few RNR retries must not meet an RNR at the
// peer because the shim sat on its receives. Requests wait during a switch (the replay depends
// on the peer's count), receives need not: once the new path accepts, a receive the application
// posts goes there at once, before the peer's answer.
TEST_CASE("During a switch a receive the application posts reaches the new path at once",
          "[engine]") {
  Rig rig;
  rig.post_recv(1);  // posted on the primary before the cut
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->sw.in_progress);  // waits for the peer's count
  auto on_standby = [] {
    int n = 0;
    for (const PostCall& call : g_recv_posts) n += call.qp != nullptr && call.qp->qp_num == 18;
    return n;
  };
  CHECK(on_standby() == 1);  // the outstanding one, re-posted by the switch
  rig.post_recv(2);
  rig.post_recv(3);
  CHECK(on_standby() == 3);
  rig.post_send(4);
  CHECK(g_posts.empty());  // a request still waits for the peer's count
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 1, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  CHECK(on_standby() == 3);  // none posted twice
  CHECK(g_posts.size() == 1);
}

// Issue 19 item 6 (seen in the lab's heal_crossed_rails): the side that answered the primary's
// re-arm waits for the peer to fail back. The peer's failback moves its end of the standby to ERR
// first and asks only after its drain (up to a second on rxe), so this side's requests on the
// standby can run out of retries before the request arrives: the errors look like a silent
// failure of the standby, this side switches to the primary as well and would hold the standby
// down for 10 s. When the crossed requests show that the peer was failing back, the errors were
// the failback's own: a failback, no hold.
TEST_CASE("Errors on the standby caused by the peer's failback are a failback, not a failure",
          "[engine]") {
  Rig rig;
  rig.deliver(rig.request_from_peer(1));  // the pair runs on the standby
  REQUIRE(rig.v->active_path() == vf::kStandby);
  REQUIRE(rig.p->failovers == 1);
  rig.v->path[vf::kPrimary].connected = true;  // the primary re-armed (this side answered)
  rig.v->path[vf::kPrimary].failed = false;
  rig.p->rearm[vf::kPrimary] = {};
  const bool rearmed_just_now = GENERATE(true, false);
  // (Without a re-arm of the primary just before, the errors are the standby's own.)
  rig.p->hold[vf::kPrimary].restored_ns = rearmed_just_now ? vf::monotonic_ns() : 0;
  rig.v->link_error_seen.store(true);  // the standby's requests ran out of retries
  vf::failover::periodic_work(*rig.e);
  REQUIRE(rig.p->sw.in_progress);
  REQUIRE(rig.p->sw.to == vf::kPrimary);
  CHECK(rig.p->hold[vf::kStandby].until_ns != 0);  // a silent failure, as far as this side knows
  rig.deliver(rig.failback_request_from_peer(2));
  REQUIRE_FALSE(rig.p->sw.in_progress);
  CHECK(rig.v->active_path() == vf::kPrimary);
  REQUIRE_FALSE(rig.p->events.empty());
  if (rearmed_just_now) {
    CHECK(rig.p->failovers == 1);
    CHECK(rig.p->failbacks == 1);
    CHECK(rig.p->hold[vf::kStandby].until_ns == 0);
    CHECK(rig.p->events.back().kind == std::string("failback"));
  } else {
    CHECK(rig.p->failovers == 2);
    CHECK(rig.p->failbacks == 0);
    CHECK(rig.p->hold[vf::kStandby].until_ns != 0);
    CHECK(rig.p->events.back().kind == std::string("failover"));
  }
}

// Issue 19 item 6: a port that flaps is not re-used between its flaps. Its paths are re-armed
// (and traffic fails back) only after it stayed ACTIVE for Engine::port_stable_ns.
TEST_CASE("A port that came back is re-armed only once it has stayed ACTIVE", "[engine]") {
  Rig rig;
  rig.e->port_stable_ns = 3600'000'000'000ull;  // an hour: "not yet" for the whole test
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 1, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  REQUIRE(rig.v->active_path() == vf::kStandby);
  rig.e->local_inbox.clear();
  auto asked = [&rig] {
    std::size_t n = rig.sent<vf::Rearm>().size();
    for (const vf::PathStatus& status : rig.sent<vf::PathStatus>()) n += status.up ? 1 : 0;
    return n;
  };
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_ACTIVE);
  vf::failover::periodic_work(*rig.e);
  CHECK(asked() == 0);  // neither a re-arm request nor an "up" notice yet
  CHECK(rig.p->rearm[vf::kPrimary].needed);
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);  // it flaps
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_ACTIVE);
  vf::failover::periodic_work(*rig.e);
  CHECK(asked() == 0);
  rig.e->port_stable_ns = 0;  // time has passed
  vf::failover::periodic_work(*rig.e);
  CHECK(asked() == 1);
}

// A flap faster than the engine reads its events: PORT_ERR is read when the port is ACTIVE
// again. It still went down: the traffic moves off it, and its return waits for stability.
TEST_CASE("A PORT_ERR read after the port came back is a flap, not nothing", "[engine]") {
  Rig rig;
  rig.e->port_stable_ns = 3600'000'000'000ull;
  static ibv_event_type next_event;
  rig.e->verbs.get_async_event = [](ibv_context*, ibv_async_event* event) {
    *event = {};
    event->event_type = next_event;
    event->element.port_num = 1;
    return 0;
  };
  rig.e->verbs.ack_async_event = [](ibv_async_event*) {};
  g_port_state = IBV_PORT_ACTIVE;  // what the port says when the event is read
  next_event = IBV_EVENT_PORT_ERR;
  vf::failover::on_device_event(*rig.e, 0);
  CHECK(rig.p->sw.in_progress);  // moving to the standby
  CHECK(rig.v->active_path() == vf::kStandby);
  CHECK(rig.e->devices[0].ports[1].active_since_ns != 0);  // back, but not yet stable
  next_event = IBV_EVENT_PORT_ACTIVE;
  vf::failover::on_device_event(*rig.e, 0);
  CHECK(rig.e->devices[0].ports[1].state == IBV_PORT_ACTIVE);
}

// An unsignaled request completes nothing, whether the peer proved it done or not: only the
// signaled one after it gets its (synthesized) completion. Caught the mutant
// `complete_unsignaled` of scripts/mutants, which no other fast test did.
TEST_CASE("Unsignaled requests the peer proved done complete nothing", "[engine]") {
  Rig rig;
  rig.post_send(0x61, false);
  rig.post_send(0x62, true);
  auto request = rig.request_from_peer(1);
  request.delivered_messages = 2;
  rig.deliver(request);
  CHECK(rig.v->counters.replayed_wrs.load() == 0);
  CHECK(rig.v->counters.synthesized_completions.load() == 1);
  ibv_wc wc[4]{};
  REQUIRE(rig.cq_state->stash.pop(4, wc) == 1);
  CHECK(wc[0].wr_id == 0x62);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
}
