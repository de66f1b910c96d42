// Completion channels (armed CQs make a real fd readable) and async events on real fds.
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <thread>

#include "fake_test_util.h"

using namespace fvtest;

namespace {
bool readable(int fd, int timeout_ms = 0) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, timeout_ms) == 1 && (pfd.revents & POLLIN);
}
}  // namespace

TEST_CASE("an armed CQ wakes its completion channel fd once") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(post_recv(p.b.qp, 2, {dst.sge(0, 64)}) == 0);
  int fd = p.b.channel->fd;
  CHECK_FALSE(readable(fd));
  REQUIRE(ibv_req_notify_cq(p.b.recv_cq, 0) == 0);
  CHECK_FALSE(readable(fd));
  Send s;
  s.sges = {src.sge(0, 4)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  REQUIRE(readable(fd));
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(p.b.channel, &cq, &cq_ctx) == 0);
  CHECK(cq == p.b.recv_cq);
  CHECK(cq_ctx == &p.b);
  ibv_ack_cq_events(cq, 1);
  CHECK_FALSE(readable(fd));
  // Not re-armed: the next completion does not wake the channel.
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK_FALSE(readable(fd));
  CHECK(poll(p.b.recv_cq, 2).size() == 2);
}

TEST_CASE("solicited-only arming ignores unsolicited receives") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  for (int i = 0; i < 2; ++i) REQUIRE(post_recv(p.b.qp, i, {dst.sge(0, 64)}) == 0);
  REQUIRE(ibv_req_notify_cq(p.b.recv_cq, 1) == 0);
  Send s;
  s.sges = {src.sge(0, 4)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK_FALSE(readable(p.b.channel->fd));
  s.flags |= IBV_SEND_SOLICITED;
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(readable(p.b.channel->fd));
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(p.b.channel, &cq, &cq_ctx) == 0);
  ibv_ack_cq_events(cq, 1);
  auto wcs = poll(p.b.recv_cq, 2);
  REQUIRE(wcs.size() == 2);
  CHECK((wcs[1].wc_flags & (1u << 31)) == 0);  // the fake's internal marker never leaks
}

TEST_CASE("a thread blocked in ibv_get_cq_event is woken by another thread's send") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ibv_req_notify_cq(p.b.recv_cq, 0) == 0);
  ibv_cq* woke = nullptr;
  std::thread waiter([&] {
    void* ctx = nullptr;
    if (ibv_get_cq_event(p.b.channel, &woke, &ctx) == 0) ibv_ack_cq_events(woke, 1);
  });
  Send s;
  s.sges = {src.sge(0, 4)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  waiter.join();
  CHECK(woke == p.b.recv_cq);
}

TEST_CASE("port down/up raise PORT_ERR/PORT_ACTIVE on that device's contexts only") {
  Clean clean;
  ibv_context* c2 = open_device("fake2");
  ibv_context* c2b = open_device("fake2");  // a second context on the same device
  ibv_context* c0 = open_device("fake0");
  CHECK_FALSE(readable(c2->async_fd));
  REQUIRE(ctl().port_down(2) == 0);
  REQUIRE(ctl().port_down(2) == 0);  // idempotent: no second event
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(c2, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_DOWN);
  REQUIRE(ibv_query_port(c0, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  for (ibv_context* c : {c2, c2b}) {
    REQUIRE(readable(c->async_fd));
    ibv_async_event ev{};
    REQUIRE(ibv_get_async_event(c, &ev) == 0);
    CHECK(ev.event_type == IBV_EVENT_PORT_ERR);
    CHECK(ev.element.port_num == 1);
    ibv_ack_async_event(&ev);
    CHECK_FALSE(readable(c->async_fd));
  }
  CHECK_FALSE(readable(c0->async_fd));
  REQUIRE(ctl().port_up(2) == 0);
  ibv_async_event ev{};
  REQUIRE(ibv_get_async_event(c2, &ev) == 0);  // blocking call: the event is already queued
  CHECK(ev.event_type == IBV_EVENT_PORT_ACTIVE);
  ibv_ack_async_event(&ev);
  REQUIRE(ibv_query_port(c2, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  CHECK(ctl().port_down(99) == -1);
  // drain c2b
  REQUIRE(ibv_get_async_event(c2b, &ev) == 0);
  CHECK(ev.event_type == IBV_EVENT_PORT_ACTIVE);
  ibv_close_device(c2);
  ibv_close_device(c2b);
  ibv_close_device(c0);
}

// The kernel knows a completion channel by its event file, never by the struct: a copy of the
// struct with the same fd works for ibv_create_cq and ibv_get_cq_event, a struct holding another
// fd is refused (EBADF), and libibverbs' refcnt counts the CQs on the struct it was given.
TEST_CASE("a completion channel is known by the fd its struct holds") {
  Clean clean;
  Pair p;
  ibv_comp_channel copy = *p.b.channel;
  copy.refcnt = 0;
  ibv_cq* cq = ibv_create_cq(p.b.ctx, 4, &p.b, &copy, 0);
  REQUIRE(cq != nullptr);
  CHECK(cq->channel == &copy);
  CHECK(copy.refcnt == 1);
  CHECK(p.b.channel->refcnt == 2);  // the endpoint's two CQs

  ibv_comp_channel wrong = *p.b.channel;
  wrong.fd = p.b.ctx->async_fd;  // a file of the context, but not a channel's
  errno = 0;
  CHECK(ibv_create_cq(p.b.ctx, 4, &p.b, &wrong, 0) == nullptr);
  CHECK(errno == EBADF);

  REQUIRE(ibv_destroy_cq(cq) == 0);
  CHECK(copy.refcnt == 0);
  CHECK(ibv_destroy_comp_channel(p.b.channel) == EBUSY);  // the endpoint's CQs live

  // An event is read through any struct holding the channel's fd.
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ibv_req_notify_cq(p.b.recv_cq, 0) == 0);
  Send s;
  s.sges = {src.sge(0, 4)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  ibv_comp_channel reader = *p.b.channel;
  ibv_cq* fired = nullptr;
  void* fired_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(&reader, &fired, &fired_ctx) == 0);
  CHECK(fired == p.b.recv_cq);
  ibv_ack_cq_events(fired, 1);
  CHECK(poll(p.b.recv_cq, 1).size() == 1);
}
