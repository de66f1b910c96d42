// The SRQ record of a protected QP's receives (issue 19 item 3), on the rig of
// tests/unit/engine_rig.h with the QP attached to a VirtualSrq: every completion of a receive the
// QP took from its SRQ retires that receive's record, error or not, so the record neither fills
// up (ENOMEM from ibv_post_srq_recv while few receives are outstanding) nor posts the buffer of a
// receive the application already got back again on a move.
#include <memory>

#include "core/virtual_srq.h"
#include "tests/unit/engine_rig.h"

namespace {

int post_srq(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  (void)bad;
  for (; wr != nullptr; wr = wr->next) g_recv_posts.push_back({nullptr, wr->wr_id, IBV_WR_SEND, wr->num_sge, 0});
  return 0;
}

struct SrqRig {
  Rig rig;
  ibv_context_ops srq_ops{};
  ibv_srq app_srq{};
  std::unique_ptr<vf::VirtualSrq> srq;

  SrqRig() {
    srq_ops.post_srq_recv = post_srq;
    srq = std::make_unique<vf::VirtualSrq>(&app_srq, &srq_ops, 2, 1, 0);
    rig.v->srq = srq.get();
  }
  ~SrqRig() { rig.v->srq = nullptr; }
  SrqRig(const SrqRig&) = delete;
  SrqRig& operator=(const SrqRig&) = delete;

  int post(std::uint64_t wr_id) {
    return Rig::post_one_receive(
        wr_id, [&](ibv_recv_wr* wr, ibv_recv_wr** bad) { return srq->post_recv(wr, bad); });
  }
  // A completion of the primary's CQ for this QP; whether the application sees it.
  bool complete(std::uint64_t wr_id, ibv_wc_status status) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = status == IBV_WC_SUCCESS ? IBV_WC_RECV : IBV_WC_SEND;  // error: undefined
    wc.qp_num = 17;
    rig.v->lock().lock();
    const bool shown = rig.v->on_completion_locked(*rig.cq_state, vf::kPrimary, wc);
    rig.v->lock().unlock();
    return shown;
  }
};

}  // namespace

TEST_CASE("An error completion of an SRQ receive retires its record", "[engine]") {
  SrqRig s;
  // A client's message too long for the receive: the receive completes in error, as the QP.
  for (std::uint64_t i = 0; i < 10 * vf::VirtualSrq::kSlack; ++i) {
    INFO("receive " << i);
    REQUIRE(s.post(0x100 + i) == 0);
    REQUIRE(s.complete(0x100 + i, IBV_WC_LOC_LEN_ERR));
  }
  CHECK(s.srq->outstanding() == 0);
}

TEST_CASE("A send's error does not retire an SRQ receive of the same wr_id", "[engine]") {
  SrqRig s;
  // One CQ for both queues, one wr_id for a send and a receive: the send queue's outstanding
  // request says whose error it is (an error completion's opcode is undefined).
  REQUIRE(s.post(0x300) == 0);
  s.rig.post_send(0x300);
  CHECK(s.complete(0x300, IBV_WC_REM_ACCESS_ERR));
  CHECK(s.srq->outstanding() == 1);
}

TEST_CASE("A hidden SRQ receive error released to the application retires its record",
          "[engine]") {
  SrqRig s;
  REQUIRE(s.post(0x400) == 0);
  // The primary fails: the receive's flush is hidden (the standby is there)...
  CHECK_FALSE(s.complete(0x400, IBV_WC_WR_FLUSH_ERR));
  CHECK(s.srq->outstanding() == 1);
  // ...then no switch can happen (a member given up, both paths gone): the application gets
  // the flush, and the receive must not be posted again by a later move.
  vf::failover::release_held_errors(*s.rig.p);
  CHECK(s.rig.cq_state->stash.size() == 1);
  CHECK(s.srq->outstanding() == 0);
}

TEST_CASE("On a pass-through QP with one CQ, a flushed request does not retire a receive",
          "[engine]") {
  SrqRig s;
  s.rig.v->set_mode(vf::PostMode::kBypass);  // its requests are no longer recorded
  REQUIRE(s.post(0)== 0);
  CHECK(s.complete(0, IBV_WC_WR_FLUSH_ERR));  // whose? a request's as likely as the receive's
  CHECK(s.srq->outstanding() == 1);
}
