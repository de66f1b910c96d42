// The RC datapath: SEND/RECV, immediates, RDMA WRITE(+IMM), READ, atomics, inline, signaling,
// ordering, length errors, queue limits and CQ overflow.
#include <poll.h>

#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("SEND/RECV delivers bytes, byte_len, opcode, wr_id and QP numbers") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 256);
  Region dst(p.b.pd, 256);
  src.fill("hello, host B");
  // Scatter over two SGEs to check the split.
  REQUIRE(post_recv(p.b.qp, 0xb1, {dst.sge(0, 5), dst.sge(100, 64)}) == 0);
  Send s;
  s.wr_id = 0xa1;
  s.sges = {src.sge(0, 13)};
  REQUIRE(post_send(p.a.qp, s) == 0);

  ibv_wc sw = poll_one(p.a.send_cq);
  CHECK(sw.status == IBV_WC_SUCCESS);
  CHECK(sw.wr_id == 0xa1);
  CHECK(sw.opcode == IBV_WC_SEND);
  CHECK(sw.qp_num == p.a.qp->qp_num);

  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.status == IBV_WC_SUCCESS);
  CHECK(rw.wr_id == 0xb1);
  CHECK(rw.opcode == IBV_WC_RECV);
  CHECK(rw.byte_len == 13);
  CHECK(rw.qp_num == p.b.qp->qp_num);
  CHECK(rw.src_qp == p.a.qp->qp_num);
  CHECK((rw.wc_flags & IBV_WC_WITH_IMM) == 0);
  CHECK(dst.str(0, 5) == "hello");
  CHECK(dst.str(100, 8) == ", host B");
  CHECK(qp_stats(p.a.qp).messages_sent == 1);
  CHECK(qp_stats(p.b.qp).messages_received == 1);
}

TEST_CASE("SEND_WITH_IMM carries the immediate in network order") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  Send s;
  s.opcode = IBV_WR_SEND_WITH_IMM;
  s.sges = {src.sge(0, 4)};
  s.imm = 0xcafef00d;
  REQUIRE(post_send(p.a.qp, s) == 0);
  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.opcode == IBV_WC_RECV);
  CHECK((rw.wc_flags & IBV_WC_WITH_IMM) != 0);
  CHECK(ntohl(rw.imm_data) == 0xcafef00d);
  CHECK(rw.byte_len == 4);
}

TEST_CASE("RDMA WRITE lands without a receive completion") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("written");
  Send w;
  w.wr_id = 3;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sges = {src.sge(0, 7)};
  w.remote_addr = dst.addr(10);
  w.rkey = dst.mr->rkey;
  REQUIRE(post_send(p.a.qp, w) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  CHECK(wc.wr_id == 3);
  CHECK(dst.str(10, 7) == "written");
  CHECK(poll(p.b.recv_cq, 1, 3).empty());
}

TEST_CASE("RDMA WRITE_WITH_IMM consumes a zero-SGE receive") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("imm-write");
  REQUIRE(post_recv(p.b.qp, 42, {}) == 0);
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.sges = {src.sge(0, 9)};
  w.remote_addr = dst.addr();
  w.rkey = dst.mr->rkey;
  w.imm = 7;
  REQUIRE(post_send(p.a.qp, w) == 0);
  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.status == IBV_WC_SUCCESS);
  CHECK(rw.wr_id == 42);
  CHECK(rw.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(rw.byte_len == 9);
  CHECK(ntohl(rw.imm_data) == 7);
  CHECK((rw.wc_flags & IBV_WC_WITH_IMM) != 0);
  CHECK(dst.str(0, 9) == "imm-write");
  CHECK(poll_one(p.a.send_cq).opcode == IBV_WC_RDMA_WRITE);
}

TEST_CASE("RDMA READ copies remote memory into local SGEs") {
  Clean clean;
  Pair p;
  Region local(p.a.pd, 64);
  Region remote(p.b.pd, 64);
  remote.fill("remote-bytes");
  Send r;
  r.wr_id = 9;
  r.opcode = IBV_WR_RDMA_READ;
  r.sges = {local.sge(0, 6), local.sge(32, 6)};
  r.remote_addr = remote.addr();
  r.rkey = remote.mr->rkey;
  REQUIRE(post_send(p.a.qp, r) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_READ);
  CHECK(wc.byte_len == 12);
  CHECK(local.str(0, 6) == "remote");
  CHECK(local.str(32, 6) == "-bytes");
}

TEST_CASE("atomics: compare-and-swap and fetch-and-add return the old value") {
  Clean clean;
  Pair p;
  Region local(p.a.pd, 16);
  Region remote(p.b.pd, 16);
  uint64_t v = 100;
  std::memcpy(remote.buf.data(), &v, 8);

  Send faa;
  faa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  faa.sges = {local.sge(0, 8)};
  faa.remote_addr = remote.addr();
  faa.rkey = remote.mr->rkey;
  faa.compare_add = 5;
  REQUIRE(post_send(p.a.qp, faa) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_FETCH_ADD);
  uint64_t old = 0;
  std::memcpy(&old, local.buf.data(), 8);
  CHECK(old == 100);
  std::memcpy(&v, remote.buf.data(), 8);
  CHECK(v == 105);

  Send cas = faa;
  cas.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  cas.compare_add = 105;
  cas.swap = 1;
  REQUIRE(post_send(p.a.qp, cas) == 0);
  wc = poll_one(p.a.send_cq);
  CHECK(wc.opcode == IBV_WC_COMP_SWAP);
  std::memcpy(&v, remote.buf.data(), 8);
  CHECK(v == 1);

  Send misaligned = faa;
  misaligned.remote_addr = remote.addr(4);
  REQUIRE(post_send(p.a.qp, misaligned) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_REM_INV_REQ_ERR);
}

TEST_CASE("inline sends copy the payload at post time") {
  Clean clean;
  QpOptions o;
  o.rnr_retry = 7;
  Pair p(o);
  Region dst(p.b.pd, 64);
  char payload[16] = "original";
  Send s;
  s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(payload), 8, 0 /* lkey ignored */}};
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  REQUIRE(post_send(p.a.qp, s) == 0);  // no receive yet: the send waits (RNR, infinite)
  std::memcpy(payload, "CLOBBER!", 8);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.byte_len == 8);
  CHECK(dst.str(0, 8) == "original");

  char big[128] = {};
  Send too_big;
  too_big.sges = {ibv_sge{reinterpret_cast<uintptr_t>(big), 65, 0}};
  too_big.flags = IBV_SEND_INLINE;
  CHECK(post_send(p.a.qp, too_big) == EINVAL);  // max_inline_data is 64
}

TEST_CASE("unsignaled sends produce no CQE and order is preserved end to end") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("ABCD");
  for (int i = 0; i < 4; ++i) REQUIRE(post_recv(p.b.qp, 100 + i, {dst.sge(i * 8, 8)}) == 0);
  for (int i = 0; i < 4; ++i) {
    Send s;
    s.wr_id = i;
    s.sges = {src.sge(i, 1)};
    s.flags = i == 3 ? IBV_SEND_SIGNALED : 0;
    REQUIRE(post_send(p.a.qp, s) == 0);
  }
  auto sends = poll(p.a.send_cq, 4, 5);
  REQUIRE(sends.size() == 1);
  CHECK(sends[0].wr_id == 3);
  auto recvs = poll(p.b.recv_cq, 4);
  REQUIRE(recvs.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(recvs[i].wr_id == uint64_t(100 + i));
    CHECK(dst.buf[i * 8] == uint8_t("ABCD"[i]));
  }
}

TEST_CASE("sq_sig_all signals every send") {
  Clean clean;
  QpOptions o;
  o.sq_sig_all = true;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.flags = 0;
  w.sges = {src.sge(0, 8)};
  w.remote_addr = dst.addr();
  w.rkey = dst.mr->rkey;
  for (int i = 0; i < 3; ++i) {
    w.wr_id = i;
    REQUIRE(post_send(p.a.qp, w) == 0);
  }
  auto wcs = poll(p.a.send_cq, 3);
  REQUIRE(wcs.size() == 3);
  CHECK(wcs[0].wr_id == 0);
  CHECK(wcs[2].wr_id == 2);
}

TEST_CASE("a receive too small: LOC_LEN_ERR at the responder, REM_INV_REQ_ERR at the requester") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 4)}) == 0);
  Send s;
  s.sges = {src.sge(0, 16)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll_one(p.b.recv_cq).status == IBV_WC_LOC_LEN_ERR);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_REM_INV_REQ_ERR);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
  CHECK(state_of(p.b.qp) == IBV_QPS_ERR);
}

TEST_CASE("queue limits: too many SGEs is EINVAL, a full send queue is ENOMEM") {
  Clean clean;
  QpOptions o;
  o.max_send_wr = 2;
  o.rnr_retry = 7;  // no receives posted: sends stay outstanding
  Pair p(o);
  Region src(p.a.pd, 64);
  Send s;
  s.sges = {src.sge(0, 1), src.sge(1, 1), src.sge(2, 1), src.sge(3, 1), src.sge(4, 1)};
  CHECK(post_send(p.a.qp, s) == EINVAL);  // max_sge 4
  s.sges = {src.sge(0, 1)};
  CHECK(post_send(p.a.qp, s) == 0);
  CHECK(post_send(p.a.qp, s) == 0);
  CHECK(post_send(p.a.qp, s) == ENOMEM);

  // A chain stops at the first bad WR and reports it.
  ibv_sge sge = src.sge(0, 1);
  ibv_recv_wr r1{}, r2{};
  r1.sg_list = r2.sg_list = &sge;
  r1.num_sge = 1;
  r2.num_sge = 9;  // too many
  r1.next = &r2;
  ibv_recv_wr* bad = nullptr;
  CHECK(ibv_post_recv(p.b.qp, &r1, &bad) == EINVAL);
  CHECK(bad == &r2);
}

namespace {

// An 8-byte RDMA WRITE from the start of src to the start of dst.
Send write_8_bytes(Region& src, Region& dst) {
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sges = {src.sge(0, 8)};
  w.remote_addr = dst.addr();
  w.rkey = dst.mr->rkey;
  return w;
}

}  // namespace

TEST_CASE("CQ overflow raises IBV_EVENT_CQ_ERR and breaks the CQ") {
  Clean clean;
  QpOptions o;
  o.cq_size = 2;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  Send w = write_8_bytes(src, dst);
  for (int i = 0; i < 3; ++i) REQUIRE(post_send(p.a.qp, w) == 0);
  pollfd pfd{p.a.ctx->async_fd, POLLIN, 0};
  REQUIRE(::poll(&pfd, 1, 0) == 1);
  ibv_async_event ev{};
  REQUIRE(ibv_get_async_event(p.a.ctx, &ev) == 0);
  CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
  CHECK(ev.element.cq == p.a.send_cq);
  ibv_ack_async_event(&ev);
  ibv_wc wc[4];
  CHECK(ibv_poll_cq(p.a.send_cq, 4, wc) == 2);  // what fitted is still there
  CHECK(ibv_poll_cq(p.a.send_cq, 4, wc) < 0);   // then the CQ reports its overrun
}

// ---- ibv_resize_cq -----------------------------------------------------------------------------

namespace {

bool async_event_pending(ibv_context* ctx) {
  pollfd pfd{ctx->async_fd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 1;
}

}  // namespace

TEST_CASE("ibv_resize_cq grows and shrinks the CQ, cqe and the overflow point follow") {
  Clean clean;
  QpOptions o;
  o.cq_size = 2;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  Send w = write_8_bytes(src, dst);
  REQUIRE(p.a.send_cq->cqe == 2);
  REQUIRE(ibv_resize_cq(p.a.send_cq, 8) == 0);
  CHECK(p.a.send_cq->cqe == 8);
  for (int i = 0; i < 6; ++i) {
    w.wr_id = uint64_t(i);
    REQUIRE(post_send(p.a.qp, w) == 0);
  }
  CHECK_FALSE(async_event_pending(p.a.ctx));  // 6 completions fit in 8, not in 2
  // Shrinking below what is queued is refused; the queued completions stay.
  CHECK(ibv_resize_cq(p.a.send_cq, 5) == EINVAL);
  CHECK(p.a.send_cq->cqe == 8);
  REQUIRE(ibv_resize_cq(p.a.send_cq, 6) == 0);  // exactly what is queued: allowed
  CHECK(p.a.send_cq->cqe == 6);
  w.wr_id = 6;
  REQUIRE(post_send(p.a.qp, w) == 0);  // the 7th does not fit in 6
  REQUIRE(async_event_pending(p.a.ctx));
  ibv_async_event ev{};
  REQUIRE(ibv_get_async_event(p.a.ctx, &ev) == 0);
  CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
  CHECK(ev.element.cq == p.a.send_cq);
  ibv_ack_async_event(&ev);
  ibv_wc wc[8];
  REQUIRE(ibv_poll_cq(p.a.send_cq, 8, wc) == 6);
  for (int i = 0; i < 6; ++i) {
    CHECK(wc[i].wr_id == uint64_t(i));  // kept in order across the resizes
    CHECK(wc[i].status == IBV_WC_SUCCESS);
  }
  // Growing does not repair an overrun CQ.
  REQUIRE(ibv_resize_cq(p.a.send_cq, 64) == 0);
  CHECK(ibv_poll_cq(p.a.send_cq, 8, wc) < 0);
}

TEST_CASE("ibv_resize_cq refuses sizes outside 1..max_cqe, also on extended CQs") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_device_attr attr{};
  REQUIRE(ibv_query_device(ctx, &attr) == 0);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  CHECK(ibv_resize_cq(cq, 0) == EINVAL);
  CHECK(ibv_resize_cq(cq, -1) == EINVAL);
  CHECK(ibv_resize_cq(cq, attr.max_cqe + 1) == EINVAL);
  CHECK(cq->cqe == 16);
  CHECK(ibv_resize_cq(cq, attr.max_cqe) == 0);
  CHECK(cq->cqe == attr.max_cqe);
  CHECK(ibv_resize_cq(cq, 1) == 0);
  CHECK(cq->cqe == 1);
  REQUIRE(ibv_destroy_cq(cq) == 0);

  ibv_cq_init_attr_ex ca{};
  ca.cqe = 4;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx, &ca);
  REQUIRE(cqx != nullptr);
  REQUIRE(ibv_resize_cq(ibv_cq_ex_to_cq(cqx), 32) == 0);
  CHECK(ibv_cq_ex_to_cq(cqx)->cqe == 32);
  REQUIRE(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("ibv_resize_cq counts queued receive completions too") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 32)}) == 0);
  REQUIRE(post_recv(p.b.qp, 2, {dst.sge(32, 32)}) == 0);
  Send s;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(ibv_resize_cq(p.b.recv_cq, 1) == EINVAL);  // two receive completions queued
  CHECK(p.b.recv_cq->cqe == 64);
  CHECK(ibv_resize_cq(p.b.recv_cq, 2) == 0);
  CHECK(p.b.recv_cq->cqe == 2);
  CHECK(poll(p.b.recv_cq, 2).size() == 2);
  CHECK(ibv_resize_cq(p.b.recv_cq, 1) == 0);  // drained: any size >= 1
  CHECK(p.b.recv_cq->cqe == 1);
}
