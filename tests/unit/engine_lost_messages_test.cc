// Control messages lost with a session that broke (issue 20 item 8), on the rig of
// tests/unit/engine_rig.h: an unanswered switch request is sent again (same epoch, same count)
// until the answer comes or the deadline passes, and the peer answers a repeated request it
// already answered with the same answer, changing nothing else.
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

TEST_CASE("A switch request that got no answer is sent again, the same", "[engine]") {
  Rig rig;
  vf::failover::start_switch(*rig.e, *rig.p, vf::kStandby, vf::FailoverReason::kPortDown);
  REQUIRE(rig.p->sw.in_progress);
  const std::vector<vf::FailoverRequest> first = rig.sent<vf::FailoverRequest>();
  REQUIRE(first.size() == 1);
  rig.e->local_inbox.clear();  // lost with its session

  vf::failover::periodic_work(*rig.e);  // too soon: nothing
  CHECK(rig.sent<vf::FailoverRequest>().empty());
  rig.p->sw.request_sent_ns = 1;  // a second and more ago
  vf::failover::periodic_work(*rig.e);
  const std::vector<vf::FailoverRequest> again = rig.sent<vf::FailoverRequest>();
  REQUIRE(again.size() == 1);
  CHECK(again[0].epoch == first[0].epoch);
  CHECK(again[0].delivered_messages == first[0].delivered_messages);
  CHECK(again[0].target_path == first[0].target_path);
  CHECK(rig.p->sw.in_progress);

  // The answer finishes the switch; a second answer (to the repeat) changes nothing.
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, first[0].epoch, vf::kStandby, false,
                                vf::FailoverReason::kPortDown);
  CHECK_FALSE(rig.p->sw.in_progress);
  CHECK(rig.p->failovers == 1);
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, first[0].epoch, vf::kStandby, false,
                                vf::FailoverReason::kPortDown);
  CHECK(rig.p->failovers == 1);
  CHECK(rig.v->active_path() == vf::kStandby);
}

TEST_CASE("A repeated switch request already answered gets the same answer, nothing more",
          "[engine]") {
  Rig rig;
  rig.post_recv(0x71);
  vf::FailoverRequest request = rig.request_from_peer(1);
  request.delivered_messages = 0;
  rig.deliver(request);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  REQUIRE(rig.v->active_path() == vf::kStandby);
  const std::vector<vf::FailoverReply> answer = rig.sent<vf::FailoverReply>();
  REQUIRE(answer.size() == 1);
  rig.e->local_inbox.clear();  // the answer was lost
  const std::size_t modifies = g_modifies.size();
  const std::size_t receives = g_recv_posts.size();

  rig.deliver(request);  // the peer repeats its request
  const std::vector<vf::FailoverReply> again = rig.sent<vf::FailoverReply>();
  REQUIRE(again.size() == 1);
  CHECK(again[0].epoch == answer[0].epoch);
  CHECK(again[0].delivered_messages == answer[0].delivered_messages);
  CHECK(again[0].target_path == vf::kStandby);
  CHECK(rig.p->failovers == 1);
  CHECK(g_modifies.size() == modifies);
  CHECK(g_recv_posts.size() == receives);
}

TEST_CASE("Crossed switches: a repeat of the peer's request after ours finished is answered",
          "[engine]") {
  Rig rig;
  vf::failover::start_switch(*rig.e, *rig.p, vf::kStandby, vf::FailoverReason::kPortDown);
  REQUIRE(rig.p->sw.in_progress);
  const std::uint32_t epoch = rig.p->sw.epoch;
  // Our request is lost; the peer's (same epoch) crosses it and finishes our switch.
  rig.e->local_inbox.clear();
  vf::FailoverRequest crossing = rig.request_from_peer(epoch);
  crossing.delivered_messages = 0;
  rig.deliver(crossing);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  REQUIRE(rig.v->active_path() == vf::kStandby);
  // The peer heard nothing and repeats its request: it must get our count, as an answer.
  rig.deliver(crossing);
  const std::vector<vf::FailoverReply> answer = rig.sent<vf::FailoverReply>();
  REQUIRE(answer.size() == 1);
  CHECK(answer[0].epoch == epoch);
  CHECK(answer[0].delivered_messages == rig.p->sw.local_count);
  CHECK(rig.p->failovers == 1);
}
