// The RC QP state machine: legal transitions, required/optional attribute masks, query, and
// which posts each state accepts.
#include <algorithm>
#include <cerrno>

#include "fake_test_util.h"

using namespace fvtest;

namespace {

struct Lone {  // one unconnected QP on fake0, peer address pointing at fake2
  Endpoint e;
  ibv_gid peer_gid{};
  Lone() {
    e.create(open_device("fake0"), QpOptions());
    ibv_context* other = open_device("fake2");
    peer_gid = gid_of(other, 1);
    ibv_close_device(other);
  }
  ~Lone() {
    e.destroy(true);
    ibv_close_device(e.ctx);
  }
};

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

}  // namespace

TEST_CASE("QP creation: RC only, caps validated and reported") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_UD;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  errno = 0;
  CHECK(ibv_create_qp(pd, &a) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 5000;
  errno = 0;
  CHECK(ibv_create_qp(pd, &a) == nullptr);
  CHECK(errno == EINVAL);
  a.cap.max_send_wr = 4;
  ibv_qp* qp = ibv_create_qp(pd, &a);
  REQUIRE(qp != nullptr);
  CHECK(qp->state == IBV_QPS_RESET);
  CHECK(qp->qp_type == IBV_QPT_RC);
  CHECK(qp->qp_num != 0);
  CHECK(ibv_qp_to_qp_ex(qp) == nullptr);  // not created with send ops flags
  CHECK(ibv_destroy_cq(cq) == EBUSY);     // the QP still uses it
  REQUIRE(ibv_destroy_qp(qp) == 0);
  REQUIRE(ibv_destroy_cq(cq) == 0);
  REQUIRE(ibv_dealloc_pd(pd) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("illegal transitions and bad masks are EINVAL and leave the state alone") {
  Clean clean;
  Lone l;
  ibv_qp* qp = l.e.qp;
  ibv_qp_attr rtr = rtr_attr(0x999, l.peer_gid);

  CHECK(ibv_modify_qp(qp, &rtr, kRtrMask) == EINVAL);  // RESET -> RTR
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  init.qp_access_flags = kAccess;
  CHECK(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) ==
        EINVAL);  // missing PORT
  CHECK(ibv_modify_qp(qp, &init,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                          IBV_QP_SQ_PSN) == EINVAL);  // extra bit
  init.port_num = 2;
  CHECK(ibv_modify_qp(qp, &init,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
        EINVAL);  // no such port
  CHECK(state_of(qp) == IBV_QPS_RESET);

  to_init(qp, kAccess);
  CHECK(state_of(qp) == IBV_QPS_INIT);
  ibv_qp_attr rts = rts_attr(7, 7);
  CHECK(ibv_modify_qp(qp, &rts, kRtsMask) == EINVAL);               // INIT -> RTS
  CHECK(ibv_modify_qp(qp, &rtr, kRtrMask & ~IBV_QP_AV) == EINVAL);  // missing AV
  CHECK(ibv_modify_qp(qp, &rtr, kRtrMask & ~IBV_QP_MIN_RNR_TIMER) == EINVAL);
  ibv_qp_attr no_grh = rtr;
  no_grh.ah_attr.is_global = 0;
  CHECK(ibv_modify_qp(qp, &no_grh, kRtrMask) == EINVAL);  // RoCE needs a GRH
  CHECK(state_of(qp) == IBV_QPS_INIT);

  REQUIRE(ibv_modify_qp(qp, &rtr, kRtrMask) == 0);
  CHECK(ibv_modify_qp(qp, &rts, kRtsMask & ~IBV_QP_RNR_RETRY) == EINVAL);
  CHECK(ibv_modify_qp(qp, &rts, kRtsMask & ~IBV_QP_SQ_PSN) == EINVAL);
  ibv_qp_attr bad_retry = rts;
  bad_retry.retry_cnt = 8;
  CHECK(ibv_modify_qp(qp, &bad_retry, kRtsMask) == EINVAL);
  CHECK(state_of(qp) == IBV_QPS_RTR);
  REQUIRE(ibv_modify_qp(qp, &rts, kRtsMask) == 0);

  ibv_qp_attr cur{};
  cur.qp_state = IBV_QPS_RTS;
  cur.cur_qp_state = IBV_QPS_RTR;  // wrong: it is RTS
  CHECK(ibv_modify_qp(qp, &cur, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
  ibv_qp_attr again{};
  again.min_rnr_timer = 5;
  CHECK(ibv_modify_qp(qp, &again, IBV_QP_MIN_RNR_TIMER) == 0);  // RTS->RTS optional attr

  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(qp, &err, IBV_QP_STATE) == 0);
  CHECK(state_of(qp) == IBV_QPS_ERR);
  CHECK(ibv_modify_qp(qp, &rts, kRtsMask) == EINVAL);  // ERR -> RTS
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  CHECK(ibv_modify_qp(qp, &reset, IBV_QP_STATE | IBV_QP_PORT) == EINVAL);  // only STATE allowed
  REQUIRE(ibv_modify_qp(qp, &reset, IBV_QP_STATE) == 0);
  to_init(qp, kAccess);  // a reset QP can be reused
  CHECK(state_of(qp) == IBV_QPS_INIT);
}

TEST_CASE("ECE: a subset of the supported options, set before RTR, forgotten at RESET") {
  Clean clean;
  Lone l;
  ibv_qp* qp = l.e.qp;
  ibv_ece ece{};
  REQUIRE(ibv_query_ece(qp, &ece) == 0);
  CHECK(ece.vendor_id == 0xfa4e);
  CHECK(ece.options == 0x3);  // the default: everything the device supports
  CHECK(qp_stats(qp).ece_options == 0x3);
  CHECK(qp_stats(qp).device_index == 0);

  ibv_ece want{0xfa4e, 0x1, 0};
  REQUIRE(ibv_set_ece(qp, &want) == 0);  // RESET
  ibv_ece bad = want;
  bad.options = 0x4;  // not supported
  CHECK(ibv_set_ece(qp, &bad) == EINVAL);
  bad = want;
  bad.vendor_id = 0x15b3;  // another vendor's options
  CHECK(ibv_set_ece(qp, &bad) == EINVAL);
  bad = want;
  bad.comp_mask = 1;
  CHECK(ibv_set_ece(qp, &bad) == EINVAL);
  to_init(qp, kAccess);
  REQUIRE(ibv_set_ece(qp, &want) == 0);  // INIT
  ibv_qp_attr rtr = rtr_attr(0x999, l.peer_gid);
  REQUIRE(ibv_modify_qp(qp, &rtr, kRtrMask) == 0);
  ibv_ece other{0xfa4e, 0x2, 0};
  CHECK(ibv_set_ece(qp, &other) == EINVAL);  // too late: RTR applied the options
  REQUIRE(ibv_query_ece(qp, &ece) == 0);
  CHECK(ece.options == 0x1);
  CHECK(qp_stats(qp).ece_options == 0x1);

  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  REQUIRE(ibv_modify_qp(qp, &reset, IBV_QP_STATE) == 0);
  REQUIRE(ibv_query_ece(qp, &ece) == 0);
  CHECK(ece.options == 0x3);
}

TEST_CASE("list_qps: the live QPs of one device") {
  Clean clean;
  Lone l;
  uint32_t numbers[64] = {};
  const int on_fake0 = ctl().list_qps(0, numbers, 64);
  REQUIRE(on_fake0 >= 1);
  REQUIRE(on_fake0 <= 64);
  CHECK(numbers[on_fake0 - 1] == l.e.qp->qp_num);  // oldest first: ours is the newest
  const int on_fake2 = ctl().list_qps(2, numbers, 64);
  for (int i = 0; i < std::min(on_fake2, 64); ++i) CHECK(numbers[i] != l.e.qp->qp_num);
  CHECK(ctl().list_qps(99, numbers, 64) == -1);
}

TEST_CASE("query_qp returns what was set") {
  Clean clean;
  Lone l;
  connect(l.e.qp, kAccess, 0x1234, l.peer_gid, 5, 3);
  ibv_qp_attr a{};
  ibv_qp_init_attr i{};
  REQUIRE(ibv_query_qp(l.e.qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_RNR_RETRY, &i) == 0);
  CHECK(a.qp_state == IBV_QPS_RTS);
  CHECK(a.dest_qp_num == 0x1234);
  CHECK(a.retry_cnt == 5);
  CHECK(a.rnr_retry == 3);
  CHECK(a.qp_access_flags == kAccess);
  CHECK(a.path_mtu == IBV_MTU_1024);
  CHECK(a.port_num == 1);
  CHECK(std::memcmp(a.ah_attr.grh.dgid.raw, l.peer_gid.raw, 16) == 0);
  CHECK(a.cap.max_send_wr == 16);
  CHECK(i.send_cq == l.e.send_cq);
  CHECK(i.qp_type == IBV_QPT_RC);
}

TEST_CASE("which states accept posts") {
  Clean clean;
  Lone l;
  Region buf(l.e.pd, 64);
  Send s;
  s.sges = {buf.sge(0, 8)};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad = nullptr;
  CHECK(post_recv(l.e.qp, 1, {buf.sge(0, 8)}) == EINVAL);  // RESET
  CHECK(ibv_post_send(l.e.qp, &wr, &bad) == EINVAL);       // RESET
  CHECK(bad == &wr);
  to_init(l.e.qp, kAccess);
  CHECK(post_recv(l.e.qp, 1, {buf.sge(0, 8)}) == 0);  // receives may be posted from INIT
  CHECK(post_send(l.e.qp, s) == EINVAL);              // sends not before RTS
  // Moving to ERR flushes the receive posted in INIT.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(l.e.qp, &err, IBV_QP_STATE) == 0);
  ibv_wc wc = poll_one(l.e.recv_cq);
  CHECK(wc.wr_id == 1);
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
  // Posting to a QP in ERR is accepted and flushes at once (like hardware).
  s.wr_id = 77;
  s.flags = 0;  // even unsignaled
  CHECK(post_send(l.e.qp, s) == 0);
  wc = poll_one(l.e.send_cq);
  CHECK(wc.wr_id == 77);
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("flush on modify only: a receive posted in ERR waits for the next move to ERR (rxe)") {
  Clean clean;
  REQUIRE(ctl().set_flush_on_modify_only(0, 1) == 0);
  Lone l;
  Region buf(l.e.pd, 64);
  to_init(l.e.qp, kAccess);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(l.e.qp, &err, IBV_QP_STATE) == 0);
  CHECK(post_recv(l.e.qp, 5, {}) == 0);
  CHECK(poll(l.e.recv_cq, 1).empty());  // not flushed, however often the CQ is polled
  REQUIRE(ibv_modify_qp(l.e.qp, &err, IBV_QP_STATE) == 0);  // ERR -> ERR is legal
  ibv_wc wc = poll_one(l.e.recv_cq);
  CHECK(wc.wr_id == 5);
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
  // fake_verbs_reset turns it off again: the next receive flushes at once.
  ctl().reset();
  CHECK(post_recv(l.e.qp, 6, {}) == 0);
  CHECK(poll_one(l.e.recv_cq).wr_id == 6);
}

TEST_CASE("SQD holds new sends until the QP is back in RTS") {
  Clean clean;
  Pair p;
  Region src(p.a.pd, 64);
  Region dst(p.b.pd, 64);
  REQUIRE(post_recv(p.b.qp, 1, {dst.sge(0, 64)}) == 0);
  ibv_qp_attr sqd{};
  sqd.qp_state = IBV_QPS_SQD;
  REQUIRE(ibv_modify_qp(p.a.qp, &sqd, IBV_QP_STATE) == 0);
  Send s;
  s.wr_id = 5;
  s.sges = {src.sge(0, 8)};
  REQUIRE(post_send(p.a.qp, s) == 0);
  CHECK(poll(p.a.send_cq, 1, 5).empty());
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  REQUIRE(ibv_modify_qp(p.a.qp, &rts, IBV_QP_STATE) == 0);
  ibv_wc wc = poll_one(p.a.send_cq);
  CHECK(wc.wr_id == 5);
  CHECK(wc.status == IBV_WC_SUCCESS);
}
