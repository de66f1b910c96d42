// core/shadow_events.h: the due / handed-out count of a CQ's shadow events, and its close at
// ibv_destroy_cq.
#include "core/shadow_events.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

using vf::ShadowEvents;

TEST_CASE("A shadow event is due, then handed out, then acknowledged", "[shadow_events]") {
  ShadowEvents events;
  CHECK_FALSE(events.hand_out());
  CHECK(events.add_due());
  CHECK(events.add_due());
  CHECK(events.hand_out());
  CHECK(events.due() == 1);
  CHECK(events.unacked() == 1);
  // Acknowledgements beyond the handed-out ones are the real CQ's.
  CHECK(events.acknowledge(3) == 1);
  CHECK(events.unacked() == 0);
  CHECK(events.acknowledge(1) == 0);
}

TEST_CASE("Closing drops the due events and bars new ones; the handed-out stay owed",
          "[shadow_events]") {
  ShadowEvents events;
  events.add_due();
  events.add_due();
  events.add_due();
  REQUIRE(events.hand_out());
  CHECK(events.close() == 2);  // the caller takes back their two tokens
  CHECK(events.close() == 0);  // a second close has none to give
  CHECK_FALSE(events.hand_out());
  CHECK_FALSE(events.add_due());
  CHECK(events.unacked() == 1);
  CHECK(events.acknowledge(1) == 1);
  events.wait_acknowledged();  // returns: nothing owed
}

TEST_CASE("After close and wait, no event of the CQ is held by anyone", "[shadow_events]") {
  // Getters hand out and acknowledge while the engine announces; the destroy closes and waits.
  // Every hand-out that succeeded must be acknowledged before the wait returns, and none may
  // succeed after it (the application would hold an event of a destroyed CQ).
  for (int round = 0; round < 200; ++round) {
    ShadowEvents events;
    std::atomic<bool> destroyed{false};
    std::atomic<int> late_hand_outs{0};
    std::vector<std::thread> getters;
    for (int t = 0; t < 2; ++t) {
      getters.emplace_back([&] {
        for (int i = 0; i < 500; ++i) {
          if (!events.hand_out()) continue;
          if (destroyed.load()) late_hand_outs.fetch_add(1);
          events.acknowledge(1);
        }
      });
    }
    std::thread engine([&] {
      for (int i = 0; i < 500 && events.add_due(); ++i) {
      }
    });
    events.close();
    events.wait_acknowledged();
    destroyed.store(true);
    CHECK_FALSE(events.hand_out());
    engine.join();
    for (std::thread& getter : getters) getter.join();
    CHECK(late_hand_outs.load() == 0);
    CHECK(events.unacked() == 0);
  }
}
