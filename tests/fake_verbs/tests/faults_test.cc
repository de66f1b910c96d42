// Injected faults: port down with in-flight work, a dead remote, silent drop, delay, counters.
#include <poll.h>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("port down fails in-flight work: RETRY_EXC_ERR for the first, FLUSH_ERR for the rest") {
  Clean clean;
  QpOptions o;
  o.rnr_retry = 7;  // no receives at B: the sends stay in flight
  Pair p(o);
  Region src(p.a.pd, 64);
  Region abuf(p.a.pd, 64);
  REQUIRE(post_recv(p.a.qp, 900, {abuf.sge(0, 64)}) == 0);
  for (int i = 1; i <= 3; ++i) {
    Send s;
    s.wr_id = i;
    s.flags = i == 2 ? 0 : IBV_SEND_SIGNALED;  // flushes are reported even when unsignaled
    s.sges = {src.sge(0, 8)};
    REQUIRE(post_send(p.a.qp, s) == 0);
  }
  REQUIRE(ctl().port_down(0) == 0);  // fake0 = host A rail 0, where p.a lives
  // Immediately, without any further progress call: the QP is in ERR and all 3 WRs completed.
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
  CHECK(qp_stats(p.a.qp).completions_with_error == 3);
  auto wcs = poll(p.a.send_cq, 3);
  REQUIRE(wcs.size() == 3);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(wcs[2].wr_id == 3);
  CHECK(wcs[2].status == IBV_WC_WR_FLUSH_ERR);
  ibv_wc rw = poll_one(p.a.recv_cq);
  CHECK(rw.wr_id == 900);
  CHECK(rw.status == IBV_WC_WR_FLUSH_ERR);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
  ibv_async_event ev{};
  REQUIRE(ibv_get_async_event(p.a.ctx, &ev) == 0);
  CHECK(ev.event_type == IBV_EVENT_PORT_ERR);
  ibv_ack_async_event(&ev);
  // B's QP had nothing outstanding: untouched.
  CHECK(state_of(p.b.qp) == IBV_QPS_RTS);
  REQUIRE(ctl().port_up(0) == 0);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);  // port up does not resurrect QPs
}

TEST_CASE("sends on a port that is already down fail at once with RETRY_EXC_ERR") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  REQUIRE(ctl().port_down(0) == 0);
  CHECK(state_of(p.a.qp) == IBV_QPS_RTS);  // nothing was in flight
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_RETRY_EXC_ERR);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
}

TEST_CASE("a peer whose port is down looks like loss: retry_cnt retries, then RETRY_EXC_ERR") {
  Clean clean;
  QpOptions o;
  o.retry_cnt = 3;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ctl().port_down(2) == 0);  // host B rail 0
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);  // try 1 (the initial attempt)
  ibv_wc wc{};
  CHECK(ibv_poll_cq(p.a.send_cq, 1, &wc) == 0);    // try 2 = retry 1
  CHECK(ibv_poll_cq(p.a.send_cq, 1, &wc) == 0);    // try 3 = retry 2
  REQUIRE(ibv_poll_cq(p.a.send_cq, 1, &wc) == 1);  // try 4 = retry 3 lost: exhausted
  CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(qp_stats(p.a.qp).transport_retries == 4);
  CHECK(qp_stats(p.b.qp).messages_received == 0);
  // B's QP had no sends in flight, so its port going down left it in RTS with its receive posted.
  CHECK(state_of(p.b.qp) == IBV_QPS_RTS);
}

TEST_CASE("silent drop: no port event, RETRY_EXC_ERR after retry_cnt retries, nothing delivered") {
  Clean clean;
  QpOptions o;
  o.retry_cnt = 1;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ctl().set_drop(2, 1) == 0);
  Send s;
  s.wr_id = 4;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);  // try 1
  CHECK(qp_stats(p.a.qp).transport_retries == 1);
  ibv_wc wc{};
  REQUIRE(ibv_poll_cq(p.a.send_cq, 1, &wc) == 1);  // try 2 = retry 1 lost: exhausted
  CHECK(wc.wr_id == 4);
  CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(poll(p.b.recv_cq, 1, 3).empty());
  pollfd fds[2] = {{p.a.ctx->async_fd, POLLIN, 0}, {p.b.ctx->async_fd, POLLIN, 0}};
  CHECK(::poll(fds, 2, 0) == 0);  // no async event anywhere
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(p.b.ctx, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  fake_verbs_device_stats ds{};
  REQUIRE(ctl().query_device_stats(0, &ds) == 0);
  CHECK(ds.dropped_packets == 2);
  CHECK(ds.tx_messages == 0);
}

TEST_CASE("drop also applies to traffic FROM the dropping device, and can be undone") {
  Clean clean;
  QpOptions o;
  o.retry_cnt = 0;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ctl().set_drop(0, 1) == 0);
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_RETRY_EXC_ERR);
  REQUIRE(ctl().set_drop(0, 0) == 0);
  Pair fresh(o);
  Region src2(fresh.a.pd, 64);
  Region dst2(fresh.b.pd, 64);
  REQUIRE(post_recv(fresh.b.qp, 1, {dst2.sge(0, 64)}) == 0);
  s.sges = {src2.sge(0, 8)};
  REQUIRE(post_send(fresh.a.qp, s) == 0);
  CHECK(poll_one(fresh.a.send_cq).status == IBV_WC_SUCCESS);
}

TEST_CASE("delay holds a delivery for exactly N progress steps") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(ctl().set_delay(2, 3) == 0);  // the remote end's delay applies too
  Send s;
  s.sges = {src.sge(0, 8)};
  uint64_t before = ctl().progress_steps();
  REQUIRE(post_send(p.a.qp, s) == 0);  // step before+1: held
  CHECK(ctl().progress_steps() == before + 1);
  CHECK(qp_stats(p.b.qp).messages_received == 0);
  ctl().progress();  // +2
  ctl().progress();  // +3
  CHECK(qp_stats(p.b.qp).messages_received == 0);
  ctl().progress();  // +4 = post step + 3
  CHECK(qp_stats(p.b.qp).messages_received == 1);
  CHECK(poll_one(p.b.recv_cq).status == IBV_WC_SUCCESS);
  // Delay 0 again: immediate.
  REQUIRE(ctl().set_delay(2, 0) == 0);
  REQUIRE(post_recv(p.b.qp, 2, {dst.sge(0, 64)}) == 0);
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(qp_stats(p.b.qp).messages_received == 2);
}

TEST_CASE("delayed messages keep their order") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("xy");
  for (int i = 0; i < 2; ++i) REQUIRE(post_recv(p.b.qp, i, {dst.sge(i * 8, 8)}) == 0);
  REQUIRE(ctl().set_delay(0, 2) == 0);
  Send s;
  s.sges = {src.sge(0, 1)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  REQUIRE(ctl().set_delay(0, 0) == 0);  // the second one alone would go at once...
  s.sges = {src.sge(1, 1)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(qp_stats(p.b.qp).messages_received == 0);  // ...but must not overtake the first
  auto wcs = poll(p.b.recv_cq, 2);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 0);
  CHECK(dst.buf[0] == 'x');
  CHECK(dst.buf[8] == 'y');
}

TEST_CASE("reset restores ports, drop, delay and zeroes counters") {
  Clean clean;
  REQUIRE(ctl().port_down(1) == 0);
  REQUIRE(ctl().set_drop(3, 1) == 0);
  ctl().reset();
  ibv_context* c1 = open_device("fake1");
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(c1, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  ibv_close_device(c1);
  Pair p({}, "fake1", "fake3");  // host A rail 1 <-> host B rail 1
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
  fake_verbs_device_stats ds{};
  REQUIRE(ctl().query_device_stats(3, &ds) == 0);
  CHECK(ds.rx_messages == 1);
  CHECK(ds.tx_messages == 0);
}

TEST_CASE("late receive completions: the sender completes at once, the receiver's CQE comes later, "
          "in order with the flushes") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 256);
  REQUIRE(ctl().set_recv_completion_delay(2, 10) == 0);  // fake2: host B, where p.b lives
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  REQUIRE(post_recv(p.b.qp, 2, {dst.sge(64, 64)}) == 0);
  Send s;
  s.wr_id = 7;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  ibv_wc sent = poll_one(p.a.send_cq);  // placed and acknowledged
  CHECK(sent.status == IBV_WC_SUCCESS);
  CHECK(qp_stats(p.b.qp).messages_received == 1);
  ibv_wc wc{};
  CHECK(ibv_poll_cq(p.b.recv_cq, 1, &wc) == 0);  // still inside the device
  // The QP goes to ERR and a receive is posted: both flushes queue behind the late success.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(p.b.qp, &err, IBV_QP_STATE) == 0);
  REQUIRE(post_recv(p.b.qp, 3, {}) == 0);
  CHECK(ibv_poll_cq(p.b.recv_cq, 1, &wc) == 0);
  auto wcs = poll(p.b.recv_cq, 3, 40);
  REQUIRE(wcs.size() == 3);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == IBV_WC_SUCCESS);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(wcs[2].wr_id == 3);
  CHECK(wcs[2].status == IBV_WC_WR_FLUSH_ERR);
}
