// Receiver-not-ready behaviour (finite and infinite rnr_retry) and shared receive queues.
#include <fcntl.h>

#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("RNR: rnr_retry N gives N retries, one per progress step, then RNR_RETRY_EXC_ERR") {
  Clean clean;
  QpOptions o;
  o.rnr_retry = 2;
  Pair p(o);
  Region src(p.a.pd, 64);
  Send s;
  s.wr_id = 11;
  s.sges = {src.sge(0, 8)};
  Send s2 = s;
  s2.wr_id = 12;
  REQUIRE(post_send(p.a.qp, s) == 0);   // first try: RNR NAK #1
  REQUIRE(post_send(p.a.qp, s2) == 0);  // its own step: RNR NAK #2 for WR 11 (head)
  CHECK(qp_stats(p.a.qp).rnr_naks == 2);
  ibv_wc wc[4];
  REQUIRE(ibv_poll_cq(p.a.send_cq, 4, wc) == 2);  // step: NAK #3 > 2 retries: fail + flush
  CHECK(wc[0].wr_id == 11);
  CHECK(wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
  CHECK(wc[1].wr_id == 12);
  CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(qp_stats(p.a.qp).rnr_naks == 3);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
}

TEST_CASE("RNR: rnr_retry 0 fails in the posting call's own step") {
  Clean clean;
  QpOptions o;
  o.rnr_retry = 0;
  Pair p(o);
  Region src(p.a.pd, 64);
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(qp_stats(p.a.qp).rnr_naks == 1);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_RNR_RETRY_EXC_ERR);
}

TEST_CASE("RNR: rnr_retry 7 waits forever until a receive is posted") {
  Clean clean;
  QpOptions o;
  o.rnr_retry = 7;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("patience");
  Send s;
  s.wr_id = 1;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll(p.a.send_cq, 1, 200).empty());
  CHECK(qp_stats(p.a.qp).rnr_naks == 201);
  CHECK(state_of(p.a.qp) == IBV_QPS_RTS);
  REQUIRE(post_recv(p.b.qp, 2, {dst.sge(0, 64)}) == 0);  // delivered within this call
  CHECK(qp_stats(p.b.qp).messages_received == 1);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
  CHECK(poll_one(p.b.recv_cq).byte_len == 8);
  CHECK(dst.str(0, 8) == "patience");
}

TEST_CASE("SRQ: receives shared by two QPs, consumed in post order") {
  Clean clean;
  ibv_context* ca = open_device("fake0");
  ibv_context* cb = open_device("fake2");
  ibv_pd* pd_b = ibv_alloc_pd(cb);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 2;
  ibv_srq* srq = ibv_create_srq(pd_b, &sa);
  REQUIRE(srq != nullptr);

  QpOptions o;
  Endpoint a1, a2, b1, b2;
  a1.create(ca, o);
  a2.create(ca, o, a1.pd);
  b1.create(cb, o, pd_b, srq);
  b2.create(cb, o, pd_b, srq);
  ibv_gid ga = gid_of(ca, 1), gb = gid_of(cb, 1);
  connect(a1.qp, o.qp_access, b1.qp->qp_num, gb, 7, 7);
  connect(b1.qp, o.qp_access, a1.qp->qp_num, ga, 7, 7);
  connect(a2.qp, o.qp_access, b2.qp->qp_num, gb, 7, 7);
  connect(b2.qp, o.qp_access, a2.qp->qp_num, ga, 7, 7);

  {
    Region src(a1.pd, 64);
    Region dst(pd_b, 64);
    src.fill("12");
    CHECK(post_recv(b1.qp, 1, {dst.sge(0, 8)}) == EINVAL);  // QP with an SRQ has no own RQ
    REQUIRE(post_srq_recv(srq, 500, {dst.sge(0, 8)}) == 0);
    REQUIRE(post_srq_recv(srq, 501, {dst.sge(8, 8)}) == 0);
    Send s;
    s.sges = {src.sge(1, 1)};
    REQUIRE(post_send(a2.qp, s) == 0);  // a2 -> b2 first: takes SRQ receive 500
    s.sges = {src.sge(0, 1)};
    REQUIRE(post_send(a1.qp, s) == 0);  // a1 -> b1: takes 501
    ibv_wc w2 = poll_one(b2.recv_cq);
    ibv_wc w1 = poll_one(b1.recv_cq);
    CHECK(w2.wr_id == 500);
    CHECK(w2.qp_num == b2.qp->qp_num);
    CHECK(w1.wr_id == 501);
    CHECK(w1.qp_num == b1.qp->qp_num);
    CHECK(dst.buf[0] == '2');
    CHECK(dst.buf[8] == '1');

    ibv_srq_attr q{};
    REQUIRE(ibv_query_srq(srq, &q) == 0);
    CHECK(q.max_wr == 8);
    CHECK(ibv_destroy_srq(srq) == EBUSY);
  }
  a1.destroy(false);
  a2.destroy(true);
  b1.destroy(false);
  b2.destroy(false);
  REQUIRE(ibv_destroy_srq(srq) == 0);
  REQUIRE(ibv_dealloc_pd(pd_b) == 0);
  ibv_close_device(ca);
  ibv_close_device(cb);
}

TEST_CASE("SRQ limit event fires once when the queue drops below the armed limit") {
  Clean clean;
  ibv_context* ca = open_device("fake0");
  ibv_context* cb = open_device("fake2");
  ibv_pd* pd_b = ibv_alloc_pd(cb);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_b, &sa);
  REQUIRE(srq != nullptr);
  ibv_srq_attr lim{};
  lim.srq_limit = 2;
  REQUIRE(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0);
  QpOptions o;
  Endpoint a, b;
  a.create(ca, o);
  b.create(cb, o, pd_b, srq);
  connect(a.qp, o.qp_access, b.qp->qp_num, gid_of(cb, 1), 7, 7);
  connect(b.qp, o.qp_access, a.qp->qp_num, gid_of(ca, 1), 7, 7);
  {
    Region src(a.pd, 64);
    Region dst(pd_b, 64);
    for (int i = 0; i < 3; ++i) REQUIRE(post_srq_recv(srq, i, {dst.sge(0, 8)}) == 0);
    Send s;
    s.sges = {src.sge(0, 1)};
    REQUIRE(post_send(a.qp, s) == 0);  // 2 left: not below the limit
    int fl = fcntl(cb->async_fd, F_GETFL);
    fcntl(cb->async_fd, F_SETFL, fl | O_NONBLOCK);
    ibv_async_event ev{};
    errno = 0;
    CHECK(ibv_get_async_event(cb, &ev) == -1);
    CHECK(errno == EAGAIN);
    REQUIRE(post_send(a.qp, s) == 0);  // 1 left: below 2
    REQUIRE(ibv_get_async_event(cb, &ev) == 0);
    CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED);
    CHECK(ev.element.srq == srq);
    ibv_ack_async_event(&ev);
    ibv_srq_attr q{};
    REQUIRE(ibv_query_srq(srq, &q) == 0);
    CHECK(q.srq_limit == 0);  // disarmed
    REQUIRE(post_send(a.qp, s) == 0);
    CHECK(ibv_get_async_event(cb, &ev) == -1);  // not again
    fcntl(cb->async_fd, F_SETFL, fl);
    CHECK(poll(b.recv_cq, 3).size() == 3);
  }
  a.destroy(true);
  b.destroy(false);
  REQUIRE(ibv_destroy_srq(srq) == 0);
  REQUIRE(ibv_dealloc_pd(pd_b) == 0);
  ibv_close_device(ca);
  ibv_close_device(cb);
}
