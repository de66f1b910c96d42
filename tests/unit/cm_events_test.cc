// The rdma_cm events the shim adds (core/cm_events.h), over a fake librdmacm: event channels are
// queues (an empty one answers EAGAIN, as a non-blocking channel does), a helper id's address
// resolution queues its event on its channel, acknowledgements and destroyed ids are recorded.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <errno.h>
#include <string.h>

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/cm_events.h"

namespace {

struct FakeCm {
  std::map<rdma_event_channel*, std::deque<rdma_cm_event*>> queues;
  // The order of acknowledgements and destroys (rdma_destroy_id waits for its id's events to
  // be acknowledged: a destroy before the ack would hang real librdmacm).
  std::vector<std::pair<char, void*>> calls;
  std::vector<sockaddr_storage> targets;
  std::vector<std::unique_ptr<rdma_cm_id>> ids;
  std::set<rdma_cm_event*> acked;
  std::set<rdma_cm_id*> destroyed;
  int create_failures = 0;
  int resolve_failures = 0;
  int resolves = 0;
  sockaddr_in first_target{};
};
FakeCm* g_cm = nullptr;

int fake_get(rdma_event_channel* channel, rdma_cm_event** event) {
  auto& queue = g_cm->queues[channel];
  if (queue.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = queue.front();
  queue.pop_front();
  return 0;
}
int fake_ack(rdma_cm_event* event) {
  g_cm->calls.emplace_back('a', event->id);
  g_cm->acked.insert(event);
  return 0;
}
int fake_create(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space) {
  if (g_cm->create_failures > 0) {
    --g_cm->create_failures;
    errno = ENOMEM;
    return -1;
  }
  g_cm->ids.push_back(std::make_unique<rdma_cm_id>());
  g_cm->ids.back()->channel = channel;
  g_cm->ids.back()->context = context;  // as librdmacm's rdma_create_id
  *id = g_cm->ids.back().get();
  return 0;
}
int fake_resolve(rdma_cm_id* id, sockaddr*, sockaddr* dst, int) {
  if (g_cm->resolves++ == 0) memcpy(&g_cm->first_target, dst, sizeof(sockaddr_in));
  sockaddr_storage copy{};
  memcpy(&copy, dst, dst->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  g_cm->targets.push_back(copy);
  if (g_cm->resolve_failures > 0) {
    --g_cm->resolve_failures;
    errno = ENODEV;
    return -1;
  }
  auto* event = new rdma_cm_event{};
  event->id = id;
  event->event = RDMA_CM_EVENT_ADDR_RESOLVED;
  g_cm->queues[id->channel].push_back(event);
  return 0;
}
int fake_destroy(rdma_cm_id* id) {
  g_cm->calls.emplace_back('d', id);
  g_cm->destroyed.insert(id);
  return 0;
}

// An application's connected id with its QP, on `channel`, and the CM events it gets.
struct Connection {
  rdma_event_channel channel{};
  rdma_cm_id id{};
  ibv_qp qp{};
  std::vector<std::unique_ptr<rdma_cm_event>> real_events;

  Connection() {
    id.channel = &channel;
    id.qp = &qp;
    qp.qp_num = 17;
    auto* address = reinterpret_cast<sockaddr_in*>(&id.route.addr.src_addr);
    address->sin_family = AF_INET;
    address->sin_addr.s_addr = htonl(0xC6120102);  // 198.18.1.2
  }
  rdma_cm_event* cm_event(rdma_cm_event_type type) {
    real_events.push_back(std::make_unique<rdma_cm_event>());
    real_events.back()->id = &id;
    real_events.back()->event = type;
    g_cm->queues[&channel].push_back(real_events.back().get());
    return real_events.back().get();
  }
};

vf::RdmaCmApi fake_api() {
  vf::RdmaCmApi api;
  api.get_cm_event = fake_get;
  api.ack_cm_event = fake_ack;
  api.create_id = fake_create;
  api.resolve_addr = fake_resolve;
  api.destroy_id = fake_destroy;
  return api;
}

struct CmRig {
  FakeCm cm;
  vf::CmEvents events{fake_api()};
  Connection c;
  CmRig() {
    g_cm = &cm;
    rdma_cm_event* got = nullptr;
    rdma_cm_event* established = c.cm_event(RDMA_CM_EVENT_ESTABLISHED);
    REQUIRE(events.get_event(&c.channel, &got) == 0);
    REQUIRE(got == established);
  }
  ~CmRig() {
    for (auto& [channel, queue] : cm.queues) {
      for (rdma_cm_event* event : queue) {
        if (event->event == RDMA_CM_EVENT_ADDR_RESOLVED) delete event;
      }
    }
    g_cm = nullptr;
  }
  // The next event the application gets, or null (EAGAIN).
  rdma_cm_event* next() {
    rdma_cm_event* got = nullptr;
    return events.get_event(&c.channel, &got) == 0 ? got : nullptr;
  }
};

}  // namespace

TEST_CASE("the peer's disconnect wakes the channel's reader and is shown once", "[rdma_cm]") {
  CmRig rig;
  CHECK(rig.events.ids_known() == 1);
  rig.events.disconnected(&rig.c.qp, 17);
  // One helper, resolving the connection's own address; its event is on the application's channel.
  REQUIRE(rig.cm.ids.size() == 1);
  rdma_cm_id* helper = rig.cm.ids[0].get();
  CHECK(helper->channel == &rig.c.channel);
  CHECK(rig.cm.first_target.sin_addr.s_addr == htonl(0xC6120102));
  REQUIRE(rig.cm.queues[&rig.c.channel].size() == 1);
  rdma_cm_event* helper_event = rig.cm.queues[&rig.c.channel].front();
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(shown->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(shown->id == &rig.c.id);
  CHECK(shown->status == 0);
  // The helper's event was acknowledged before its id was destroyed, never shown.
  CHECK(rig.cm.acked.count(helper_event) == 1);
  CHECK(rig.cm.destroyed.count(helper) == 1);
  REQUIRE(rig.cm.calls.size() == 2);
  CHECK(rig.cm.calls[0] == std::make_pair('a', static_cast<void*>(helper)));
  CHECK(rig.cm.calls[1] == std::make_pair('d', static_cast<void*>(helper)));
  delete helper_event;
  CHECK(rig.events.ack_own_event(shown));
  CHECK_FALSE(rig.events.ack_own_event(shown));  // once
  // The CM's own DISCONNECTED, arriving later, is dropped (acknowledged, not shown).
  rdma_cm_event* late = rig.c.cm_event(RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.next() == nullptr);
  CHECK(rig.cm.acked.count(late) == 1);
  // A second notice of the peer changes nothing.
  rig.events.disconnected(&rig.c.qp, 17);
  CHECK(rig.cm.ids.size() == 1);
}

TEST_CASE("the CM's own DISCONNECTED first: the shim's is not shown", "[rdma_cm]") {
  CmRig rig;
  rdma_cm_event* real = rig.c.cm_event(RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.next() == real);
  rig.events.disconnected(&rig.c.qp, 17);
  CHECK(rig.cm.ids.empty());  // no helper: nothing to give
  CHECK(rig.next() == nullptr);
  SECTION("and when the notice came between: the helper's event is swallowed") {
    CmRig second;
    second.events.disconnected(&second.c.qp, 17);
    REQUIRE(second.cm.queues[&second.c.channel].size() == 1);
    // The CM's event reaches the application before the helper's.
    second.cm.queues[&second.c.channel].push_front(
        (second.c.real_events.push_back(std::make_unique<rdma_cm_event>()),
         second.c.real_events.back().get()));
    second.c.real_events.back()->id = &second.c.id;
    second.c.real_events.back()->event = RDMA_CM_EVENT_DISCONNECTED;
    CHECK(second.next() == second.c.real_events.back().get());
    CHECK(second.next() == nullptr);  // the helper's event: swallowed, the shim's not shown
    CHECK(second.cm.destroyed.count(second.cm.ids[0].get()) == 1);
  }
}

TEST_CASE("no helper can be made: the event waits for the channel's next read", "[rdma_cm]") {
  CmRig rig;
  SECTION("creating the helper fails") { rig.cm.create_failures = 1; }
  SECTION("resolving both addresses fails") {
    rig.cm.resolve_failures = 2;
  }
  rig.events.disconnected(&rig.c.qp, 17);
  CHECK(rig.cm.queues[&rig.c.channel].empty());
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(shown->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.events.ack_own_event(shown));
  for (auto& id : rig.cm.ids) CHECK(rig.cm.destroyed.count(id.get()) == 1);
}

TEST_CASE("the loopback is resolved when the id's own address cannot be", "[rdma_cm]") {
  CmRig rig;
  rig.cm.resolve_failures = 1;
  rig.events.disconnected(&rig.c.qp, 17);
  CHECK(rig.cm.resolves == 2);
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(shown->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.events.ack_own_event(shown));
}

TEST_CASE("an id destroyed before its event is read gets nothing", "[rdma_cm]") {
  CmRig rig;
  SECTION("with a helper") {}
  SECTION("without") { rig.cm.create_failures = 1; }
  rig.events.disconnected(&rig.c.qp, 17);
  rig.events.before_destroy(&rig.c.id);
  CHECK(rig.next() == nullptr);
  rig.events.after_destroy(&rig.c.id);
  CHECK(rig.events.ids_known() == 0);
}

TEST_CASE("the CM's DISCONNECTED read while the id is destroyed is still dropped", "[rdma_cm]") {
  CmRig rig;
  rig.cm.create_failures = 1;
  rig.events.disconnected(&rig.c.qp, 17);
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(rig.events.ack_own_event(shown));
  rig.events.before_destroy(&rig.c.id);
  // Another thread reads the CM's own between the two halves of rdma_destroy_id.
  rig.c.cm_event(RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.next() == nullptr);
  // A new id at the same address that reached ESTABLISHED meanwhile keeps its entry.
  rig.c.cm_event(RDMA_CM_EVENT_ESTABLISHED);
  REQUIRE(rig.next() != nullptr);
  rig.events.after_destroy(&rig.c.id);
  CHECK(rig.events.ids_known() == 1);
  CHECK_FALSE(rig.events.disconnect_shown(&rig.c.id));
}

TEST_CASE("a helper's events are told by its context, not by its address", "[rdma_cm]") {
  CmRig rig;
  rig.events.disconnected(&rig.c.qp, 17);
  REQUIRE(rig.cm.ids.size() == 1);
  rdma_cm_id* helper = rig.cm.ids[0].get();
  CHECK(helper->context == vf::CmEvents::helper_context());
  // A later event of the helper (an address change) is dropped too, never shown.
  auto later = std::make_unique<rdma_cm_event>();
  later->id = helper;
  later->event = RDMA_CM_EVENT_ADDR_CHANGE;
  rig.cm.queues[&rig.c.channel].push_back(later.get());
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(shown->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.next() == nullptr);
  CHECK(rig.cm.acked.count(later.get()) == 1);
  CHECK(rig.events.ack_own_event(shown));
}

TEST_CASE("a destroy after the shim's event was acknowledged returns; id->event is not waited for",
          "[rdma_cm]") {
  CmRig rig;
  rig.cm.create_failures = 1;  // the event waits in the ready queue
  rig.events.disconnected(&rig.c.qp, 17);
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  SECTION("acknowledged first") {
    CHECK(rig.events.ack_own_event(shown));
    rig.events.before_destroy(&rig.c.id);  // would wait for ever for an unacknowledged one
  }
  SECTION("a synchronous id's last event, which the real destroy acknowledges itself") {
    rig.c.id.event = shown;
    rig.events.before_destroy(&rig.c.id);
    CHECK(rig.events.ack_own_event(shown));
  }
  rig.events.after_destroy(&rig.c.id);
  CHECK(rig.events.ids_known() == 0);
}

TEST_CASE("a peer disconnect before the ESTABLISHED is read is given right after it",
          "[rdma_cm]") {
  FakeCm cm;
  g_cm = &cm;
  vf::CmEvents events(fake_api());
  Connection c;
  events.disconnected(&c.qp, 17);  // no id known yet
  rdma_cm_event* established = c.cm_event(RDMA_CM_EVENT_ESTABLISHED);
  rdma_cm_event* got = nullptr;
  REQUIRE(events.get_event(&c.channel, &got) == 0);
  CHECK(got == established);
  REQUIRE(events.get_event(&c.channel, &got) == 0);
  CHECK(got->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(got->id == &c.id);
  CHECK(events.ack_own_event(got));
  g_cm = nullptr;
}

TEST_CASE("an IPv6 connection's helper falls back to ::1, with a helper of its own",
          "[rdma_cm]") {
  CmRig rig;
  auto* address = reinterpret_cast<sockaddr_in6*>(&rig.c.id.route.addr.src_addr);
  *address = {};
  address->sin6_family = AF_INET6;
  address->sin6_port = htons(7471);
  inet_pton(AF_INET6, "fd00::2", &address->sin6_addr);
  rig.cm.resolve_failures = 1;
  rig.events.disconnected(&rig.c.qp, 17);
  REQUIRE(rig.cm.targets.size() == 2);
  const auto* first = reinterpret_cast<const sockaddr_in6*>(&rig.cm.targets[0]);
  const auto* second = reinterpret_cast<const sockaddr_in6*>(&rig.cm.targets[1]);
  CHECK(first->sin6_family == AF_INET6);
  CHECK(first->sin6_port == 0);
  CHECK(second->sin6_family == AF_INET6);
  CHECK(memcmp(&second->sin6_addr, &in6addr_loopback, sizeof(in6_addr)) == 0);
  REQUIRE(rig.cm.ids.size() == 2);  // a fresh helper for the second try
  CHECK(rig.cm.destroyed.count(rig.cm.ids[0].get()) == 1);
  rdma_cm_event* shown = rig.next();
  REQUIRE(shown != nullptr);
  CHECK(shown->event == RDMA_CM_EVENT_DISCONNECTED);
  CHECK(rig.events.ack_own_event(shown));
}

TEST_CASE("a null event pointer is EINVAL, as in librdmacm", "[rdma_cm]") {
  CmRig rig;
  errno = 0;
  CHECK(rig.events.get_event(&rig.c.channel, nullptr) == -1);
  CHECK(errno == EINVAL);
}

TEST_CASE("QPs without an ESTABLISHED id, and other events, pass as they are", "[rdma_cm]") {
  CmRig rig;
  ibv_qp other{};
  other.qp_num = 99;
  rig.events.disconnected(&other, 99);
  rig.events.disconnected(&rig.c.qp, 18);  // same QP struct, another QPN: a reused address
  CHECK(rig.cm.ids.empty());
  rdma_cm_event* real = rig.c.cm_event(RDMA_CM_EVENT_TIMEWAIT_EXIT);
  CHECK(rig.next() == real);
  CHECK_FALSE(rig.events.ack_own_event(real));
  CHECK(rig.cm.acked.empty());
}
