// An atomic in flight when a path fails (issue 19 item 10), on the rig of
// tests/unit/engine_rig.h. Whether it executed at the responder cannot be known, and its result
// may be lost, so it cannot be replayed; RC's only outcomes then are an error for it and a flush
// for everything posted after it (the QP is in ERR). A later request that succeeds, fenced or
// not, is an outcome RC never produces.
#include "core/failover/path_recovery.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

std::uint64_t g_atomic_target = 0;

void post_fetch_add(Rig& rig, std::uint64_t wr_id) {
  static std::uint64_t result = 0;
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(&result), sizeof result, 0};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = reinterpret_cast<std::uintptr_t>(&g_atomic_target);
  wr.wr.atomic.rkey = 0x1234;
  wr.wr.atomic.compare_add = 1;
  ibv_send_wr* bad = nullptr;
  REQUIRE(rig.v->post_send(&wr, &bad) == 0);
}

// The rig mirrors no registration: every rkey of the peer is taken as known on the standby.
void every_rkey_known() {
  vf::DatapathServices services = vf::datapath_services();
  services.translate_rkey = [](std::uint64_t, std::uint32_t rkey, std::uint32_t* out) {
    *out = rkey;
    return true;
  };
  vf::set_datapath_services(services);
}

void post_read(Rig& rig, std::uint64_t wr_id) {
  static char buffer[8];
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer), sizeof buffer, 0};
  ibv_send_wr read{};
  read.wr_id = wr_id;
  read.sg_list = &sge;
  read.num_sge = 1;
  read.opcode = IBV_WR_RDMA_READ;
  read.send_flags = IBV_SEND_SIGNALED;
  read.wr.rdma.rkey = 0x1234;
  ibv_send_wr* bad = nullptr;
  REQUIRE(rig.v->post_send(&read, &bad) == 0);
}

// Everything the application's CQ got from the switch, in order.
std::vector<ibv_wc> stashed(Rig& rig) {
  std::vector<ibv_wc> out(16);
  out.resize(static_cast<std::size_t>(rig.cq_state->stash.pop(16, out.data())));
  return out;
}

bool moved_to_error(const ibv_qp* qp) {
  for (const ModifyCall& call : g_modifies) {
    if (call.qp == qp && call.state == IBV_QPS_ERR) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("An atomic in flight at a failover: it fails, and nothing after it succeeds",
          "[engine]") {
  Rig rig;
  rig.post_send(0x71);         // delivered before the cut
  post_fetch_add(rig, 0x72);   // may or may not have executed
  rig.post_send(0x73);         // delivered: so the atomic executed, but its result is lost
  rig.post_send(0x74, false);  // not delivered, unsignaled
  const std::size_t posted = g_posts.size();
  auto request = rig.request_from_peer(1);
  request.delivered_messages = 2;
  rig.deliver(request);

  const std::vector<ibv_wc> wcs = stashed(rig);
  REQUIRE(wcs.size() == 4);
  CHECK(wcs[0].wr_id == 0x71);
  CHECK(wcs[0].status == IBV_WC_SUCCESS);
  CHECK(wcs[1].wr_id == 0x72);
  CHECK(wcs[1].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(wcs[1].opcode == IBV_WC_FETCH_ADD);
  // Flushed, the unsignaled one too (a device reports every flushed request).
  CHECK(wcs[2].wr_id == 0x73);
  CHECK(wcs[2].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(wcs[3].wr_id == 0x74);
  CHECK(wcs[3].status == IBV_WC_WR_FLUSH_ERR);
  for (const ibv_wc& wc : wcs) CHECK(wc.qp_num == 17);
  CHECK(g_posts.size() == posted);  // nothing replayed
  CHECK(rig.v->send_ring().outstanding() == 0);
  // The QP is failed for good, as the application's QP would be: the path its receives and later
  // requests go to is in ERR (they flush), no path is re-armed, and the peer is told.
  CHECK(rig.v->application_failed.load());
  CHECK(moved_to_error(&rig.standby_qp));
  CHECK(rig.p->ended);
  CHECK_FALSE(rig.p->rearm[vf::kPrimary].needed);
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
  vf::failover::periodic_work(*rig.e);  // nothing more: no re-arm asked, no second notice
  CHECK(rig.sent<vf::Rearm>().empty());
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
}

TEST_CASE("An atomic in flight at a failover: earlier requests not delivered flush with it",
          "[engine]") {
  // RC reports the first request it could not complete with the error, and flushes the rest:
  // a request before the atomic that must be replayed would complete after the atomic's error.
  Rig rig;
  rig.post_send(0x81);  // not delivered
  post_fetch_add(rig, 0x82);
  auto request = rig.request_from_peer(1);
  request.delivered_messages = 0;
  const std::size_t posted = g_posts.size();
  rig.deliver(request);
  const std::vector<ibv_wc> wcs = stashed(rig);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 0x81);
  CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(wcs[1].wr_id == 0x82);
  CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(g_posts.size() == posted);
}

TEST_CASE("An atomic posted during a switch is not lost: it goes on the new path", "[engine]") {
  Rig rig;
  every_rkey_known();
  vf::failover::on_port_change(*rig.e, 0, 1, IBV_PORT_DOWN);
  REQUIRE(rig.p->sw.in_progress);
  post_fetch_add(rig, 0xb1);  // held until the peer answers: it never left the host
  CHECK(g_posts.empty());
  vf::failover::handle_failover(*rig.e, rig.p->local, 0, 1, vf::kStandby, false,
                                vf::FailoverReason::kPeerRequest);
  REQUIRE_FALSE(rig.p->sw.in_progress);
  CHECK_FALSE(rig.v->application_failed.load());
  CHECK_FALSE(rig.p->ended);
  CHECK(stashed(rig).empty());
  REQUIRE(g_posts.size() == 1);
  CHECK(g_posts[0].qp == &rig.standby_qp);
  CHECK(g_posts[0].opcode == IBV_WR_ATOMIC_FETCH_AND_ADD);
}

TEST_CASE("A failover with no atomic in flight still replays", "[engine]") {
  Rig rig;
  rig.post_send(0x91);
  auto request = rig.request_from_peer(1);
  request.delivered_messages = 0;
  rig.deliver(request);
  CHECK(rig.v->counters.replayed_wrs.load() == 1);
  CHECK_FALSE(rig.v->application_failed.load());
  CHECK(stashed(rig).empty());
}

TEST_CASE("A request proven done behind a replayed READ completes after it, as a stand-in",
          "[engine]") {
  // RC completes a send queue in order: the SEND the peer received must not complete before the
  // READ posted ahead of it, which is replayed (its response may have been lost).
  Rig rig;
  every_rkey_known();
  post_read(rig, 0xa1);
  rig.post_send(0xa2);
  const std::size_t posted = g_posts.size();
  auto request = rig.request_from_peer(1);
  request.delivered_messages = 1;  // the SEND arrived
  rig.deliver(request);
  CHECK(stashed(rig).empty());  // nothing completes ahead of the READ
  REQUIRE(g_posts.size() == posted + 2);
  CHECK(g_posts[posted].qp == &rig.standby_qp);
  CHECK(g_posts[posted].opcode == IBV_WR_RDMA_READ);
  // The SEND is not sent again: a zero-length WRITE stands in for it.
  CHECK(g_posts[posted + 1].opcode == IBV_WR_RDMA_WRITE);
  CHECK(g_posts[posted + 1].num_sge == 0);
  CHECK((g_posts[posted + 1].send_flags & IBV_SEND_SIGNALED) != 0);  // or no completion comes
  CHECK(rig.v->counters.replayed_wrs.load() == 1);
  // The standby completes both, in order: the application sees the READ, then its SEND.
  ibv_wc read_done{};
  read_done.wr_id = g_posts[posted].wr_id;
  read_done.opcode = IBV_WC_RDMA_READ;
  read_done.qp_num = 18;
  ibv_wc stand_in_done{};
  stand_in_done.wr_id = g_posts[posted + 1].wr_id;
  stand_in_done.opcode = IBV_WC_RDMA_WRITE;
  stand_in_done.qp_num = 18;
  rig.v->lock().lock();
  CHECK(rig.v->on_completion_locked(*rig.cq_state, vf::kStandby, read_done));
  CHECK(rig.v->on_completion_locked(*rig.cq_state, vf::kStandby, stand_in_done));
  rig.v->lock().unlock();
  CHECK(read_done.wr_id == 0xa1);
  CHECK(stand_in_done.wr_id == 0xa2);
  CHECK(stand_in_done.opcode == IBV_WC_SEND);
  CHECK(rig.v->send_ring().outstanding() == 0);
}

TEST_CASE("A failback completes a request proven done at once: no stand-in on the primary",
          "[engine]") {
  // The primary's peer QP has the application's access flags: a zero-length WRITE to a QP without
  // IBV_ACCESS_REMOTE_WRITE fails (rxe, mlx5), so no stand-in goes there (a known limit).
  Rig rig;
  every_rkey_known();
  rig.fail_over_and_rearm();
  post_read(rig, 0xc1);
  rig.post_send(0xc2);
  const std::size_t posted = g_posts.size();
  auto request = rig.failback_request_from_peer(2);
  request.delivered_messages = 1;
  rig.deliver(request);
  REQUIRE(rig.v->active_path() == vf::kPrimary);
  for (std::size_t i = posted; i < g_posts.size(); ++i) {
    CHECK(g_posts[i].opcode != IBV_WR_RDMA_WRITE);
  }
  const std::vector<ibv_wc> wcs = stashed(rig);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].wr_id == 0xc2);
}

TEST_CASE("A failback waits for an atomic in flight on the standby", "[engine]") {
  // The failback stops the standby like any switch: an atomic in flight there would be lost and
  // fail the QP, though the standby works. It waits until the atomic is done.
  Rig rig;
  every_rkey_known();
  rig.p->attrs.have_init = rig.p->attrs.have_rtr = rig.p->attrs.have_rts = true;
  rig.deliver(rig.request_from_peer(1));  // the pair runs on the standby; the primary to re-arm
  REQUIRE(rig.v->active_path() == vf::kStandby);
  post_fetch_add(rig, 0xd1);
  REQUIRE(g_posts.size() == 1);
  CHECK(g_posts[0].qp == &rig.standby_qp);
  rig.e->local_inbox.clear();
  vf::failover::maybe_rearm(*rig.e, *rig.p, vf::kPrimary);  // this end asks (the smaller QPN)
  REQUIRE(rig.sent<vf::Rearm>().size() == 1);
  vf::Rearm reply = rig.rearm_from_peer(vf::kPrimary, rig.sent<vf::Rearm>()[0].nonce);
  reply.is_reply = true;
  vf::failover::handle_rearm(*rig.e, reply);
  REQUIRE(rig.v->path[vf::kPrimary].connected);
  CHECK_FALSE(rig.p->sw.in_progress);  // not while the atomic is in flight
  CHECK(rig.p->failback_deferred);
  vf::failover::periodic_work(*rig.e);
  CHECK_FALSE(rig.p->sw.in_progress);
  // The atomic completes on the standby; the next pass fails back.
  ibv_wc done{};
  done.wr_id = g_posts[0].wr_id;
  done.opcode = IBV_WC_FETCH_ADD;
  done.qp_num = 18;
  rig.v->lock().lock();
  REQUIRE(rig.v->on_completion_locked(*rig.cq_state, vf::kStandby, done));
  rig.v->lock().unlock();
  CHECK(done.wr_id == 0xd1);
  vf::failover::periodic_work(*rig.e);
  CHECK(rig.p->sw.in_progress);
  CHECK(rig.p->sw.to == vf::kPrimary);
  CHECK_FALSE(rig.p->failback_deferred);
}
