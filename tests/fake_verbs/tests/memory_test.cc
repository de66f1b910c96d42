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

// ---- ibv_rereg_mr ------------------------------------------------------------------------------

namespace {

constexpr int kAllRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// One RDMA WRITE of `len` bytes from `src` to (remote_addr, rkey), signaled; its status.
ibv_wc_status write_status(Pair& p, const ibv_sge& src, uint64_t remote_addr, uint32_t rkey) {
  Send w;
  w.wr_id = 0x77;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sges = {src};
  w.remote_addr = remote_addr;
  w.rkey = rkey;
  REQUIRE(post_send(p.a.qp, w) == 0);
  return poll_one(p.a.send_cq).status;
}

}  // namespace

TEST_CASE("ibv_rereg_mr CHANGE_TRANSLATION|CHANGE_ACCESS moves the MR and gives it new keys") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  src.fill("moved!");
  std::vector<uint8_t> buf1(256, 0x11), buf2(512, 0x22);
  ibv_mr* mr = ibv_reg_mr(p.b.pd, buf1.data(), buf1.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr != nullptr);
  const uint32_t old_lkey = mr->lkey, old_rkey = mr->rkey, handle = mr->handle;
  REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, nullptr,
                       buf2.data(), buf2.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0);
  CHECK(mr->addr == buf2.data());
  CHECK(mr->length == buf2.size());
  CHECK(mr->pd == p.b.pd);
  CHECK(mr->context == p.b.ctx);
  CHECK(mr->handle == handle);
  CHECK(mr->lkey == mr->rkey);
  CHECK(mr->lkey != old_lkey);
  CHECK(mr->rkey != old_rkey);
  const uint64_t base2 = reinterpret_cast<uintptr_t>(buf2.data());
  const uint64_t base1 = reinterpret_cast<uintptr_t>(buf1.data());

  SECTION("a READ through the new rkey reads the new buffer (REMOTE_READ granted)") {
    std::memcpy(buf2.data() + 100, "second", 6);
    Send r;
    r.opcode = IBV_WR_RDMA_READ;
    r.sges = {src.sge(8, 6)};
    r.remote_addr = base2 + 100;
    r.rkey = mr->rkey;
    REQUIRE(post_send(p.a.qp, r) == 0);
    CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
    CHECK(src.str(8, 6) == "second");
  }
  SECTION("a WRITE is refused now: REMOTE_WRITE was taken away") {
    CHECK(write_status(p, src.sge(0, 6), base2, mr->rkey) == IBV_WC_REM_ACCESS_ERR);
    CHECK(buf2[0] == 0x22);
  }
  SECTION("the old rkey no longer validates, at the old or the new address") {
    CHECK(write_status(p, src.sge(0, 6), base1, old_rkey) == IBV_WC_REM_ACCESS_ERR);
    CHECK(buf1 == std::vector<uint8_t>(256, 0x11));
  }
  SECTION("the new rkey does not cover the old buffer") {
    Send r;
    r.opcode = IBV_WR_RDMA_READ;
    r.sges = {src.sge(8, 6)};
    r.remote_addr = base1;
    r.rkey = mr->rkey;
    REQUIRE(post_send(p.a.qp, r) == 0);
    CHECK(poll_one(p.a.send_cq).status == IBV_WC_REM_ACCESS_ERR);
  }
  SECTION("the old lkey no longer validates locally") {
    ibv_sge s{base2, 16, old_lkey};
    REQUIRE(post_recv(p.b.qp, 5, {s}) == 0);
    Send m;
    m.sges = {src.sge(0, 6)};
    REQUIRE(post_send(p.a.qp, m) == 0);
    ibv_wc wc = poll_one(p.b.recv_cq);
    CHECK(wc.wr_id == 5);
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
  }
  SECTION("the new lkey receives into the new buffer") {
    ibv_sge s{base2 + 8, 16, mr->lkey};
    REQUIRE(post_recv(p.b.qp, 6, {s}) == 0);
    Send m;
    m.sges = {src.sge(0, 6)};
    REQUIRE(post_send(p.a.qp, m) == 0);
    ibv_wc wc = poll_one(p.b.recv_cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(std::string(reinterpret_cast<char*>(buf2.data()) + 8, 6) == "moved!");
    CHECK(buf1 == std::vector<uint8_t>(256, 0x11));
  }
  REQUIRE(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("ibv_rereg_mr gives new keys on every success, an IOVA MR moves to its new address") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  src.fill("iova->va");
  std::vector<uint8_t> buf(128, 0);
  ibv_mr* mr = ibv_reg_mr_iova(p.b.pd, buf.data(), buf.size(), 0x10000, kAllRemote);
  REQUIRE(mr != nullptr);
  const uint32_t k0 = mr->rkey;
  REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kAllRemote) == 0);
  const uint32_t k1 = mr->rkey;
  CHECK(k1 != k0);
  CHECK(mr->addr == buf.data());  // untouched without CHANGE_TRANSLATION
  CHECK(write_status(p, src.sge(0, 8), 0x10000, k1) == IBV_WC_SUCCESS);  // still addressed by IOVA
  CHECK(std::string(reinterpret_cast<char*>(buf.data()), 8) == "iova->va");
  // Same buffer, CHANGE_TRANSLATION: addressed by its virtual address from now on.
  REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf.data() + 64, 64, 0) == 0);
  CHECK(mr->rkey != k1);
  CHECK(mr->rkey != k0);
  CHECK(mr->length == 64);
  CHECK(write_status(p, src.sge(0, 8), reinterpret_cast<uintptr_t>(buf.data()) + 64, mr->rkey) ==
        IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<char*>(buf.data()) + 64, 8) == "iova->va");
  REQUIRE(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("ibv_rereg_mr CHANGE_PD moves the MR (and its PD reference) to another PD") {
  Clean clean;
  Pair p;
  Region dst(p.b.pd, 64);
  ibv_pd* other = ibv_alloc_pd(p.a.ctx);
  REQUIRE(other != nullptr);
  std::vector<uint8_t> buf(64, 0);
  std::memcpy(buf.data(), "pd move", 7);
  ibv_mr* mr = ibv_reg_mr(other, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr != nullptr);
  CHECK(ibv_dealloc_pd(other) == EBUSY);
  Send s;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.remote_addr = dst.addr();
  s.rkey = dst.mr->rkey;

  SECTION("before: the MR is in another PD than A's QP, a local protection error") {
    s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(buf.data()), 7, mr->lkey}};
    REQUIRE(post_send(p.a.qp, s) == 0);
    CHECK(poll_one(p.a.send_cq).status == IBV_WC_LOC_PROT_ERR);
    REQUIRE(ibv_dereg_mr(mr) == 0);
  }
  SECTION("after CHANGE_PD to A's PD the new key works, and the old PD is free") {
    const uint32_t old_lkey = mr->lkey;
    REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, p.a.pd, nullptr, 0, 0) == 0);
    CHECK(mr->pd == p.a.pd);
    CHECK(mr->lkey != old_lkey);
    CHECK(mr->addr == buf.data());
    CHECK(ibv_dealloc_pd(other) == 0);
    other = nullptr;
    s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(buf.data()), 7, mr->lkey}};
    REQUIRE(post_send(p.a.qp, s) == 0);
    CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
    CHECK(dst.str(0, 7) == "pd move");
    REQUIRE(ibv_dereg_mr(mr) == 0);
  }
  if (other != nullptr) CHECK(ibv_dealloc_pd(other) == 0);
}

TEST_CASE("ibv_rereg_mr errors: ERR_INPUT / ERR_CMD + EINVAL, the MR unchanged and usable") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  src.fill("still ok");
  ibv_context* other_ctx = open_device("fake1");
  ibv_pd* other_pd = ibv_alloc_pd(other_ctx);
  REQUIRE(other_pd != nullptr);
  std::vector<uint8_t> buf(128, 0), buf2(128, 0);
  ibv_mr* mr = ibv_reg_mr(p.b.pd, buf.data(), buf.size(), kAllRemote);
  REQUIRE(mr != nullptr);
  const uint32_t key = mr->rkey;
  const int T = IBV_REREG_MR_CHANGE_TRANSLATION, P = IBV_REREG_MR_CHANGE_PD,
            A = IBV_REREG_MR_CHANGE_ACCESS;
  struct Bad {
    const char* what;
    int flags;
    ibv_pd* pd;
    void* addr;
    size_t length;
    int access;
    int want;
  };
  const Bad cases[] = {
      {"unknown flag", A | (IBV_REREG_MR_FLAGS_SUPPORTED + 1), nullptr, nullptr, 0, kAllRemote,
       IBV_REREG_MR_ERR_INPUT},
      {"translation to NULL", T, nullptr, nullptr, 64, 0, IBV_REREG_MR_ERR_INPUT},
      {"translation of length 0", T, nullptr, buf2.data(), 0, 0, IBV_REREG_MR_ERR_INPUT},
      {"access without CHANGE_ACCESS", T, nullptr, buf2.data(), 64, kAllRemote,
       IBV_REREG_MR_ERR_INPUT},
      {"no flags", 0, nullptr, nullptr, 0, 0, IBV_REREG_MR_ERR_CMD},
      {"CHANGE_PD to NULL", P, nullptr, nullptr, 0, 0, IBV_REREG_MR_ERR_CMD},
      {"CHANGE_PD to another context's PD", P, other_pd, nullptr, 0, 0, IBV_REREG_MR_ERR_CMD},
      {"remote write without local write", A | T, nullptr, buf2.data(), 64, IBV_ACCESS_REMOTE_WRITE,
       IBV_REREG_MR_ERR_CMD},
      {"remote atomic without local write", A, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_ATOMIC,
       IBV_REREG_MR_ERR_CMD},
      {"longer than max_mr_size", T, nullptr, buf2.data(), size_t(1) << 41, 0,
       IBV_REREG_MR_ERR_CMD},
  };
  for (const Bad& c : cases) {
    INFO(c.what);
    errno = 0;
    CHECK(ibv_rereg_mr(mr, c.flags, c.pd, c.addr, c.length, c.access) == c.want);
    CHECK(errno == EINVAL);
    CHECK(mr->rkey == key);
    CHECK(mr->lkey == key);
    CHECK(mr->addr == buf.data());
    CHECK(mr->length == buf.size());
    CHECK(mr->pd == p.b.pd);
  }
  CHECK(ibv_dealloc_pd(other_pd) == 0);  // no failed CHANGE_PD left a reference behind
  CHECK(write_status(p, src.sge(0, 8), reinterpret_cast<uintptr_t>(buf.data()), key) ==
        IBV_WC_SUCCESS);
  CHECK(std::string(reinterpret_cast<char*>(buf.data()), 8) == "still ok");
  REQUIRE(ibv_dereg_mr(mr) == 0);
  REQUIRE(ibv_close_device(other_ctx) == 0);
}
