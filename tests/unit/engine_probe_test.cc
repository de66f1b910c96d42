// Probes of the idle standby (core/failover/path_probe.h): what a round posts, and what each
// answer (or its absence) does to the pair.
#include "tests/unit/engine_rig.h"

#include "core/clock.h"
#include "core/failover/limits.h"
#include "core/failover/path_probe.h"

namespace {

using vf::failover::next_probe_due_ns;
using vf::failover::probe_idle_standby;
using vf::failover::probe_in_flight;
using vf::failover::probe_round_due;

constexpr std::uint64_t kPeriodNs = 1'000'000'000;

std::vector<PostCall> probes_posted(const ibv_qp* qp) {
  std::vector<PostCall> out;
  for (const PostCall& call : g_posts)
    if (call.qp == qp && vf::is_probe_wr_id(call.wr_id)) out.push_back(call);
  return out;
}

// The probe's completion as the data path polls it from the standby's CQ shadow.
bool complete_probe(Rig& rig, std::uint64_t wr_id, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RDMA_WRITE;
  wc.qp_num = rig.standby_qp.qp_num;
  rig.v->lock().lock();
  const bool shown = rig.v->on_completion_locked(*rig.cq_state, vf::kStandby, wc);
  rig.v->lock().unlock();
  return shown;
}

// A round now: one probe posted on the idle standby; returns its wr_id.
std::uint64_t post_round(Rig& rig, std::uint64_t now) {
  REQUIRE(probe_round_due(*rig.e, now));
  probe_idle_standby(*rig.e, *rig.p, now, true);
  const auto posted = probes_posted(&rig.standby_qp);
  REQUIRE_FALSE(posted.empty());
  return posted.back().wr_id;
}

}  // namespace

TEST_CASE("Probes: the first round is due at once, so an engine with nothing else to do wakes for it",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  // 0 would read as "no probe ever" and the engine's wait would have no end.
  CHECK(next_probe_due_ns(*rig.e) != 0);
  CHECK(probe_round_due(*rig.e, 5));
  CHECK(next_probe_due_ns(*rig.e) == 5 + kPeriodNs);
  CHECK_FALSE(probe_round_due(*rig.e, 6));
  rig.e->probe_interval_ns = 0;
  CHECK(next_probe_due_ns(*rig.e) == 0);
  CHECK_FALSE(probe_round_due(*rig.e, 10 * kPeriodNs));
}

TEST_CASE("Probes: a round posts one signaled zero-length RDMA WRITE on the idle standby",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  const std::uint64_t id = post_round(rig, now);
  const auto posted = probes_posted(&rig.standby_qp);
  REQUIRE(posted.size() == 1);
  CHECK(posted[0].opcode == IBV_WR_RDMA_WRITE);
  CHECK(posted[0].num_sge == 0);
  CHECK((posted[0].send_flags & IBV_SEND_SIGNALED) != 0);
  CHECK(probes_posted(&rig.app_qp).empty());  // never on the application's own QP
  CHECK(probe_in_flight(*rig.p));
  // While it waits for its answer, no round posts another.
  probe_idle_standby(*rig.e, *rig.p, now + 1, true);
  CHECK(probes_posted(&rig.standby_qp).size() == 1);
  SECTION("answered: nothing changes, and the next round probes again") {
    CHECK_FALSE(complete_probe(rig, id, IBV_WC_SUCCESS));  // hidden from the application
    probe_idle_standby(*rig.e, *rig.p, now + 2, false);
    CHECK_FALSE(probe_in_flight(*rig.p));
    CHECK(rig.p->unprotected_reason.empty());
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
    CHECK(rig.sent<vf::PathStatus>().empty());
    probe_idle_standby(*rig.e, *rig.p, now + kPeriodNs, true);
    CHECK(probes_posted(&rig.standby_qp).size() == 2);
    CHECK(rig.p->probe.sent == 2);
    CHECK(rig.p->probe.failures == 0);
  }
  SECTION("an answer of an older probe is not this one's") {
    CHECK_FALSE(complete_probe(rig, id - 1, IBV_WC_RETRY_EXC_ERR));
    probe_idle_standby(*rig.e, *rig.p, now + 2, false);
    CHECK(probe_in_flight(*rig.p));
    CHECK(rig.p->unprotected_reason.empty());
  }
}

TEST_CASE("Probes: a probe whose retries ran out fails the standby silently: held, unprotected, "
          "the peer told",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  const std::uint64_t id = post_round(rig, now);
  CHECK_FALSE(complete_probe(rig, id, IBV_WC_RETRY_EXC_ERR));
  probe_idle_standby(*rig.e, *rig.p, now + 1, false);
  CHECK(rig.v->path[vf::kStandby].failed);
  CHECK(rig.p->rearm[vf::kStandby].needed);
  CHECK(rig.p->hold[vf::kStandby].until_ns > now);
  CHECK(rig.p->unprotected_reason.find("standby path failed silently and is held down") !=
        std::string::npos);
  CHECK(rig.p->probe.failures == 1);
  CHECK_FALSE(probe_in_flight(*rig.p));
  CHECK(rig.v->active_path() == vf::kPrimary);  // the traffic stays where it is
  CHECK_FALSE(rig.p->sw.in_progress);
  const auto notices = rig.sent<vf::PathStatus>();
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].path == vf::kStandby);
  CHECK_FALSE(notices[0].up);
  // A failed standby is not probed (its re-arm comes first).
  g_posts.clear();
  probe_idle_standby(*rig.e, *rig.p, now + kPeriodNs, true);
  CHECK(probes_posted(&rig.standby_qp).empty());
}

TEST_CASE("Probes: a probe with no completion at all fails the standby after the answer timeout",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  post_round(rig, now);
  probe_idle_standby(*rig.e, *rig.p, now + vf::failover::kProbeAnswerTimeoutNs / 2, false);
  CHECK_FALSE(rig.v->path[vf::kStandby].failed);
  probe_idle_standby(*rig.e, *rig.p, now + vf::failover::kProbeAnswerTimeoutNs + 1, false);
  CHECK(rig.v->path[vf::kStandby].failed);
  CHECK(rig.p->rearm[vf::kStandby].needed);
  CHECK_FALSE(rig.p->unprotected_reason.empty());
}

TEST_CASE("Probes: a probe refused by the peer stops the probes of that QP and re-arms its "
          "standby without a hold",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  const std::uint64_t id = post_round(rig, now);
  complete_probe(rig, id, IBV_WC_REM_ACCESS_ERR);
  probe_idle_standby(*rig.e, *rig.p, now + 1, false);
  CHECK(rig.p->probe.disabled);
  CHECK(rig.v->path[vf::kStandby].failed);
  CHECK(rig.p->rearm[vf::kStandby].needed);
  CHECK(rig.p->hold[vf::kStandby].until_ns == 0);
  CHECK(rig.p->unprotected_reason.find("REM_ACCESS_ERR") != std::string::npos);
}

TEST_CASE("Probes: a standby that does not idle is not probed, and a probe in flight is forgotten",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  SECTION("the standby carries the traffic") {
    rig.v->set_active_path(vf::kStandby);
    probe_idle_standby(*rig.e, *rig.p, now, true);
    CHECK(probes_posted(&rig.standby_qp).empty());
  }
  SECTION("a switch is under way") {
    const std::uint64_t id = post_round(rig, now);
    rig.p->sw.in_progress = true;
    probe_idle_standby(*rig.e, *rig.p, now + 1, true);
    CHECK_FALSE(probe_in_flight(*rig.p));
    CHECK(probes_posted(&rig.standby_qp).size() == 1);
    // Its late error (the switch moved the QP) is hidden and changes nothing.
    rig.p->sw.in_progress = false;
    CHECK_FALSE(complete_probe(rig, id, IBV_WC_WR_FLUSH_ERR));
    CHECK_FALSE(rig.v->path[vf::kStandby].failed);
  }
  SECTION("probes are off") {
    rig.e->probe_interval_ns = 0;
    probe_idle_standby(*rig.e, *rig.p, now, true);
    CHECK(probes_posted(&rig.standby_qp).empty());
  }
}

TEST_CASE("Probes: a probe's completion never reaches the application, whatever path is active",
          "[engine][probe]") {
  Rig rig;
  rig.v->set_active_path(vf::kStandby);
  rig.v->set_accepting(vf::kStandby, true);
  CHECK_FALSE(complete_probe(rig, vf::kProbeTag | 7, IBV_WC_SUCCESS));
  CHECK_FALSE(complete_probe(rig, vf::kProbeTag | 8, IBV_WC_RETRY_EXC_ERR));
  CHECK_FALSE(rig.v->link_error_seen.load());
  CHECK(rig.v->counters.hidden_error_completions.load() == 0);
}

TEST_CASE("Probes: a standby just connected (paired or re-armed) is not probed until the peer's "
          "end has had time to connect, and a probe in flight dies with its reset",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  const std::uint64_t now = vf::monotonic_ns();
  post_round(rig, now);
  REQUIRE(probe_in_flight(*rig.p));
  // The peer asked for a re-arm of the standby and this side answers it: its end is reset and
  // connected at once (to RTS: the application's QP is in RTS), the asker's only when our answer
  // reaches it.
  rig.p->attrs.have_rts = true;
  REQUIRE(vf::failover::reset_path(*rig.e, *rig.p, vf::kStandby, nullptr));
  CHECK_FALSE(probe_in_flight(*rig.p));  // no completion will come for it
  REQUIRE(vf::failover::connect_path(*rig.e, *rig.p, vf::kStandby, 44, gid(3), 300));
  g_posts.clear();
  const std::uint64_t connected = vf::monotonic_ns();
  probe_idle_standby(*rig.e, *rig.p, connected + 1, true);
  CHECK(probes_posted(&rig.standby_qp).empty());
  probe_idle_standby(*rig.e, *rig.p, connected + vf::failover::kProbeQuietAfterConnectNs + 1, true);
  CHECK(probes_posted(&rig.standby_qp).size() == 1);
}

TEST_CASE("Probes: after answering a re-arm of the standby, no probe until the asker could have "
          "asked again (its answer may be lost)",
          "[engine][probe]") {
  Rig rig;
  rig.e->probe_interval_ns = kPeriodNs;
  rig.p->attrs.have_rts = true;
  vf::Rearm request;
  request.local = rig.p->remote;
  request.remote = rig.p->local;
  request.path = vf::kStandby;
  request.nonce = 3;
  request.qpn = 44;
  request.gid = gid(3);
  request.psn = 300;
  const std::uint64_t before = vf::monotonic_ns();
  vf::failover::handle_rearm(*rig.e, request);
  REQUIRE(rig.p->rearm[vf::kStandby].answered_nonce == 3);  // answered: our end is connected
  const std::uint64_t quiet = rig.e->rearm_retry_ns + vf::failover::kProbeQuietAfterConnectNs;
  CHECK(rig.p->probe.quiet_until_ns >= before + quiet);
  g_posts.clear();
  probe_idle_standby(*rig.e, *rig.p, before + vf::failover::kProbeQuietAfterConnectNs + 1, true);
  CHECK(probes_posted(&rig.standby_qp).empty());
  probe_idle_standby(*rig.e, *rig.p, vf::monotonic_ns() + quiet + 1, true);
  CHECK(probes_posted(&rig.standby_qp).size() == 1);
}
