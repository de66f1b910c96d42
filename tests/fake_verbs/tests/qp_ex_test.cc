// The extended QP (ibv_qp_ex) and the ibv_wr_* posting API, through the unmodified inline
// wrappers of <infiniband/verbs.h>.
#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

namespace {
QpOptions extended() {
  QpOptions o;
  o.extended = true;
  return o;
}
}  // namespace

TEST_CASE("ibv_qp_to_qp_ex returns the embedded ibv_qp_ex with wr_* ops filled") {
  Clean clean;
  Pair p(extended());
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(p.a.qp);
  REQUIRE(qpx != nullptr);
  CHECK(&qpx->qp_base == p.a.qp);
  CHECK(qpx->wr_start != nullptr);
  CHECK(qpx->wr_complete != nullptr);
  CHECK(qpx->wr_abort != nullptr);
  CHECK(qpx->wr_send != nullptr);
  CHECK(qpx->wr_send_imm != nullptr);
  CHECK(qpx->wr_rdma_write != nullptr);
  CHECK(qpx->wr_rdma_write_imm != nullptr);
  CHECK(qpx->wr_rdma_read != nullptr);
  CHECK(qpx->wr_set_sge != nullptr);
  CHECK(qpx->wr_set_sge_list != nullptr);
  CHECK(qpx->wr_set_inline_data != nullptr);
  CHECK(qpx->wr_set_inline_data_list != nullptr);
  CHECK(qpx->wr_atomic_fetch_add != nullptr);
  CHECK(qpx->wr_bind_mw == nullptr);
}

TEST_CASE("a batch of RDMA WRITE + SEND_IMM(inline) posted with ibv_wr_*") {
  Clean clean;
  Pair p(extended());
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  src.fill("batched");
  REQUIRE(post_recv(p.b.qp, 77, {dst.sge(32, 16)}) == 0);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(p.a.qp);
  char inline_msg[8] = "inline";
  ibv_wr_start(qpx);
  qpx->wr_id = 1;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, dst.mr->rkey, dst.addr());
  ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 7);
  qpx->wr_id = 2;
  qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_wr_send_imm(qpx, htonl(0x1234));
  ibv_wr_set_inline_data(qpx, inline_msg, 6);
  std::memcpy(inline_msg, "XXXXXX", 6);  // copied by the setter already
  REQUIRE(ibv_wr_complete(qpx) == 0);
  auto wcs = poll(p.a.send_cq, 2);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].opcode == IBV_WC_RDMA_WRITE);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].opcode == IBV_WC_SEND);
  CHECK(dst.str(0, 7) == "batched");
  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.wr_id == 77);
  CHECK(rw.byte_len == 6);
  CHECK(ntohl(rw.imm_data) == 0x1234);
  CHECK(dst.str(32, 6) == "inline");
}

TEST_CASE("ibv_wr_rdma_read, sge lists, inline lists, write_imm and fetch_add") {
  Clean clean;
  Pair p(extended());
  Region local(p.a.pd, 64);
  Region remote(p.b.pd, 64);
  remote.fill("abcdefgh");
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(p.a.qp);

  ibv_wr_start(qpx);
  qpx->wr_id = 10;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_read(qpx, remote.mr->rkey, remote.addr());
  ibv_sge list[2] = {local.sge(0, 4), local.sge(16, 4)};
  ibv_wr_set_sge_list(qpx, 2, list);
  REQUIRE(ibv_wr_complete(qpx) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.opcode == IBV_WC_RDMA_READ);
  CHECK(wc.byte_len == 8);
  CHECK(local.str(0, 4) == "abcd");
  CHECK(local.str(16, 4) == "efgh");

  REQUIRE(post_recv(p.b.qp, 5, {}) == 0);
  char p1[] = "12", p2[] = "345";
  ibv_data_buf bufs[2] = {{p1, 2}, {p2, 3}};
  ibv_wr_start(qpx);
  qpx->wr_id = 11;
  qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_wr_rdma_write_imm(qpx, remote.mr->rkey, remote.addr(40), htonl(9));
  ibv_wr_set_inline_data_list(qpx, 2, bufs);
  REQUIRE(ibv_wr_complete(qpx) == 0);
  CHECK(poll_one(p.a.send_cq).wr_id == 11);
  ibv_wc rw = poll_one(p.b.recv_cq);
  CHECK(rw.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(rw.byte_len == 5);
  CHECK(remote.str(40, 5) == "12345");

  uint64_t counter = 41;
  std::memcpy(remote.buf.data() + 56, &counter, 8);
  ibv_wr_start(qpx);
  qpx->wr_id = 12;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_fetch_add(qpx, remote.mr->rkey, remote.addr(56), 1);
  ibv_wr_set_sge(qpx, local.mr->lkey, local.addr(32), 8);
  REQUIRE(ibv_wr_complete(qpx) == 0);
  CHECK(poll_one(p.a.send_cq).opcode == IBV_WC_FETCH_ADD);
  std::memcpy(&counter, remote.buf.data() + 56, 8);
  CHECK(counter == 42);
}

TEST_CASE("ibv_wr_abort posts nothing, and a bad batch posts nothing and fails") {
  Clean clean;
  QpOptions o = extended();
  o.send_ops = IBV_QP_EX_WITH_RDMA_WRITE;  // only writes enabled
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(p.a.qp);

  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, dst.mr->rkey, dst.addr());
  ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 4);
  ibv_wr_abort(qpx);
  CHECK(poll(p.a.send_cq, 1, 3).empty());
  CHECK(qp_stats(p.a.qp).messages_sent == 0);

  ibv_wr_start(qpx);
  ibv_wr_rdma_write(qpx, dst.mr->rkey, dst.addr());
  ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 4);
  ibv_wr_send(qpx);  // not enabled at create time
  ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 4);
  CHECK(ibv_wr_complete(qpx) == EINVAL);
  CHECK(qp_stats(p.a.qp).messages_sent == 0);  // all or nothing
}

TEST_CASE("ibv_create_qp_ex rejects unknown send ops and unsupported comp_mask bits") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
  ibv_qp_init_attr_ex a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 2;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.pd = pd;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = IBV_QP_EX_WITH_BIND_MW;
  errno = 0;
  CHECK(ibv_create_qp_ex(ctx, &a) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
  errno = 0;
  CHECK(ibv_create_qp_ex(ctx, &a) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  a.create_flags = IBV_QP_CREATE_SCATTER_FCS;  // a real flag the fake does not model
  errno = 0;
  CHECK(ibv_create_qp_ex(ctx, &a) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  a.create_flags = 0;  // no flags: fine
  ibv_qp* qp = ibv_create_qp_ex(ctx, &a);
  REQUIRE(qp != nullptr);
  CHECK(ibv_qp_to_qp_ex(qp) == nullptr);
  REQUIRE(ibv_destroy_qp(qp) == 0);
  REQUIRE(ibv_destroy_cq(cq) == 0);
  REQUIRE(ibv_dealloc_pd(pd) == 0);
  ibv_close_device(ctx);
}
