// Protection domains, memory regions and the lkey/rkey/access/bounds checks of the datapath.
#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("MR registration: keys, access rules, PD busy") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd != nullptr);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr1 = ibv_reg_mr(pd, buf.data(), 2048, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr2 =
      ibv_reg_mr(pd, buf.data() + 2048, 2048, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr1 != nullptr);
  REQUIRE(mr2 != nullptr);
  CHECK(mr1->lkey != 0);
  CHECK(mr1->lkey == mr1->rkey);
  CHECK(mr1->lkey != mr2->lkey);
  CHECK(mr1->addr == buf.data());
  CHECK(mr1->length == 2048);
  CHECK(mr1->pd == pd);
  errno = 0;
  CHECK(ibv_reg_mr(pd, buf.data(), 64, IBV_ACCESS_REMOTE_WRITE) == nullptr);  // needs LOCAL_WRITE
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_reg_mr(pd, buf.data(), 64, IBV_ACCESS_REMOTE_ATOMIC) == nullptr);
  CHECK(errno == EINVAL);
  // Non-constant access flags make the header call ibv_reg_mr_iova2 instead; same result.
  volatile int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
  ibv_mr* mr3 = ibv_reg_mr(pd, buf.data(), 64, access);
  REQUIRE(mr3 != nullptr);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  REQUIRE(ibv_dereg_mr(mr1) == 0);
  REQUIRE(ibv_dereg_mr(mr2) == 0);
  REQUIRE(ibv_dereg_mr(mr3) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("address handles need a GRH on RoCE") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_ah_attr attr{};
  attr.port_num = 1;
  errno = 0;
  CHECK(ibv_create_ah(pd, &attr) == nullptr);
  CHECK(errno == EINVAL);
  attr.is_global = 1;
  attr.grh.sgid_index = 1;
  ibv_ah* ah = ibv_create_ah(pd, &attr);
  REQUIRE(ah != nullptr);
  CHECK(ibv_destroy_ah(ah) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("local protection errors complete with LOC_PROT_ERR and put the QP in ERR") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 256);
  Region dst(p.b.pd, 256);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 256)}) == 0);

  SECTION("unknown lkey") {
    Send s;
    s.wr_id = 10;
    s.sges = {ibv_sge{src.addr(), 16, 0xdead}};
    REQUIRE(post_send(p.a.qp, s) == 0);
  }
  SECTION("SGE beyond the MR") {
    Send s;
    s.wr_id = 10;
    s.sges = {src.sge(250, 16)};
    REQUIRE(post_send(p.a.qp, s) == 0);
  }
  SECTION("MR of another PD") {
    Send s;
    s.wr_id = 10;
    s.sges = {dst.sge(0, 16)};  // dst belongs to b's PD
    REQUIRE(post_send(p.a.qp, s) == 0);
  }
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.wr_id == 10);
  CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
  CHECK(poll(p.b.recv_cq, 1, 5).empty());  // nothing reached the responder
  CHECK(state_of(p.b.qp) == IBV_QPS_RTS);
}

TEST_CASE("remote access errors complete with REM_ACCESS_ERR") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 256);
  Region ro(p.b.pd, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);  // no remote write
  Region rw(p.b.pd, 256);
  Send s;
  s.wr_id = 7;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.sges = {src.sge(0, 32)};
  s.remote_addr = rw.addr();
  s.rkey = rw.mr->rkey;

  SECTION("bad rkey") {
    s.rkey = 0xbad;
  }
  SECTION("MR without REMOTE_WRITE") {
    s.remote_addr = ro.addr();
    s.rkey = ro.mr->rkey;
  }
  SECTION("beyond the remote MR") {
    s.remote_addr = rw.addr(240);
  }
  SECTION("rkey of the requester's own PD") {
    s.rkey = src.mr->rkey;
  }
  REQUIRE(post_send(p.a.qp, s) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.wr_id == 7);
  CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
  CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
  CHECK(rw.str(0, 4) == std::string(4, '\0'));
}

TEST_CASE("QP access flags gate remote operations") {
  Clean clean;
  QpOptions o;
  o.qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;  // responder refuses writes
  Pair p(o);
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sges = {src.sge(0, 8)};
  w.remote_addr = dst.addr();
  w.rkey = dst.mr->rkey;
  REQUIRE(post_send(p.a.qp, w) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("RDMA READ into a local MR without LOCAL_WRITE is a local protection error") {
  Clean clean;
  Pair p;
  Region local(p.a.pd, 64, IBV_ACCESS_REMOTE_READ);
  Region remote(p.b.pd, 64);
  Send r;
  r.opcode = IBV_WR_RDMA_READ;
  r.sges = {local.sge(0, 8)};
  r.remote_addr = remote.addr();
  r.rkey = remote.mr->rkey;
  REQUIRE(post_send(p.a.qp, r) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_LOC_PROT_ERR);
}

TEST_CASE("MRs registered with an IOVA are addressed by IOVA") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  std::vector<uint8_t> target(64, 0);
  ibv_mr* mr = ibv_reg_mr_iova(p.b.pd, target.data(), target.size(), 0x10000,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr != nullptr);
  src.fill("iova!");
  Send w;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sges = {src.sge(0, 5)};
  w.remote_addr = 0x10000 + 8;
  w.rkey = mr->rkey;
  REQUIRE(post_send(p.a.qp, w) == 0);
  CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<char*>(target.data()) + 8, 5) == "iova!");
  REQUIRE(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("ECE: query reports the fake's vendor id with no options, set accepts plain values") {
  Clean clean;
  Pair p;
  ibv_ece ece{};
  REQUIRE(ibv_query_ece(p.a.qp, &ece) == 0);
  CHECK(ece.vendor_id == 0xfa4e);
  CHECK(ece.options == 0);
  CHECK(ibv_set_ece(p.a.qp, &ece) == 0);
  ece.comp_mask = 1;
  CHECK(ibv_set_ece(p.a.qp, &ece) == EINVAL);
}
