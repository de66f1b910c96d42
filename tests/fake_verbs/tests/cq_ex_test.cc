// Extended CQs: ibv_create_cq_ex and the start_poll/next_poll/read_* iterator of
// <infiniband/verbs.h>, used unchanged.
#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("ibv_cq_ex iterator returns the same completions as ibv_poll_cq would") {
  Clean clean;
  QpOptions o;
  o.extended_cq = true;
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 31, {dst.sge(0, 32)}) == 0);
  REQUIRE(post_recv(p.b.qp, 32, {}) == 0);
  Send s;
  s.opcode = IBV_WR_SEND_WITH_IMM;
  s.imm = 0xabcd;
  s.sges = {src.sge(0, 12)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.imm = 5;
  w.sges = {src.sge(0, 3)};
  w.remote_addr = dst.addr(40);
  w.rkey = dst.mr->rkey;
  REQUIRE(post_send(p.a.qp, w) == 0);

  ibv_cq_ex* cqx = reinterpret_cast<ibv_cq_ex*>(p.b.recv_cq);
  ibv_poll_cq_attr attr{};
  REQUIRE(ibv_start_poll(cqx, &attr) == 0);
  CHECK(cqx->status == IBV_WC_SUCCESS);
  CHECK(cqx->wr_id == 31);
  CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_RECV);
  CHECK(ibv_wc_read_byte_len(cqx) == 12);
  CHECK(ntohl(ibv_wc_read_imm_data(cqx)) == 0xabcd);
  CHECK((ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM) != 0);
  CHECK(ibv_wc_read_qp_num(cqx) == p.b.qp->qp_num);
  CHECK(ibv_wc_read_src_qp(cqx) == p.a.qp->qp_num);
  REQUIRE(ibv_next_poll(cqx) == 0);
  CHECK(cqx->wr_id == 32);
  CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(ibv_wc_read_byte_len(cqx) == 3);
  CHECK(ibv_next_poll(cqx) == ENOENT);
  ibv_end_poll(cqx);
  CHECK(ibv_start_poll(cqx, &attr) == ENOENT);  // empty: no end_poll needed

  // The same CQ still works with ibv_poll_cq through ibv_cq_ex_to_cq().
  CHECK(poll(p.a.send_cq, 2).size() == 2);
}
