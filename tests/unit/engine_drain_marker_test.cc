// The drain marker of a switch (issue 19 item 9, core/failover/path_drain.cc), on the rig of
// tests/unit/engine_rig.h with a provider that takes the marker and writes its flush when the
// test says: one marker timeout must not mark a device "not flushing" for the rest of the
// process, and an engine thread starved of the CPU past the deadline must look once more before
// it concludes the flush never came.
#include <sched.h>

#include "core/clock.h"
#include "core/datapath_registries.h"
#include "core/failover/limits.h"
#include "core/failover/path_drain.h"
#include "tests/unit/engine_rig.h"

namespace {

// The markers' fate on the primary's QP: each one taken by post_recv is flushed by the
// provider's poll once `flush_after_polls` polls have found nothing (0: the first poll writes it;
// never when negative), up to `flush_limit` flushes in all. `starve_first_poll` makes the first
// poll after a marker return nothing only once the drain's whole wait has passed: the engine's
// thread was starved of the CPU while the flush came.
struct MarkerProvider {
  int markers_posted = 0;
  int flushes_written = 0;
  int polls_without_flush = 0;
  int flush_after_polls = 0;
  int flush_limit = 1 << 30;
  bool starve_first_poll = false;
  bool all_flushed() const { return markers_posted > 0 && flushes_written == markers_posted; }
};
MarkerProvider g_marker;

int marker_post_recv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr**) {
  for (; wr != nullptr; wr = wr->next) {
    if (wr->wr_id == vf::kDrainMarkerWrId) ++g_marker.markers_posted;
  }
  return 0;
}

int marker_poll_cq(ibv_cq*, int num_entries, ibv_wc* wc) {
  if (g_marker.flushes_written == g_marker.markers_posted) return 0;
  if (g_marker.starve_first_poll) {
    g_marker.starve_first_poll = false;
    const std::uint64_t until =
        vf::monotonic_ns() + vf::failover::kReceiveFlushWaitNs + 1'000'000;
    while (vf::monotonic_ns() < until) sched_yield();  // the CPU given to others, not to us
    return 0;
  }
  if (g_marker.flush_after_polls < 0 ||
      g_marker.polls_without_flush++ < g_marker.flush_after_polls) {
    return 0;
  }
  int n = 0;
  while (n < num_entries && g_marker.flushes_written < g_marker.markers_posted &&
         g_marker.flushes_written < g_marker.flush_limit) {
    ++g_marker.flushes_written;
    wc[n] = ibv_wc{};
    wc[n].wr_id = vf::kDrainMarkerWrId;
    wc[n].status = IBV_WC_WR_FLUSH_ERR;
    wc[n].qp_num = 17;
    ++n;
  }
  return n;
}

// The rig's QP 17 found by its number, as the datapath finds a completion's QP, and the
// provider above in place of the rig's.
struct MarkerRig {
  Rig rig;
  ibv_context_ops saved = g_ops;
  const void* key = vf::qpn_registry_key(0, 17);

  MarkerRig() {
    g_marker = {};
    g_ops.post_recv = marker_post_recv;
    g_ops.poll_cq = marker_poll_cq;
    REQUIRE(vf::datapath_registries::qps_by_qpn.insert(key, rig.v));
    rig.v->lock().lock();
    rig.v->set_accepting(vf::kPrimary, false);  // the switch has begun: the old path is left
    rig.v->lock().unlock();
  }
  ~MarkerRig() {
    vf::datapath_registries::qps_by_qpn.erase(key);
    g_ops = saved;
  }
  MarkerRig(const MarkerRig&) = delete;
  MarkerRig& operator=(const MarkerRig&) = delete;

  vf::failover::Device& device() { return rig.e->devices[0]; }
  void drain() { vf::failover::drain_old_path(*rig.e, *rig.p, vf::kPrimary, true); }
};

}  // namespace

TEST_CASE("A device that once missed the marker's deadline is given the marker again later",
          "[engine]") {
  MarkerRig m;
  // An earlier switch timed out on this device (an engine starved of the CPU, a flush storm).
  m.device().marker_flush = vf::failover::Device::MarkerFlush::kNo;
  m.device().marker_retry_at_ns = vf::monotonic_ns();  // its back-off has passed
  m.drain();
  CHECK(g_marker.markers_posted == 1);
  CHECK(g_marker.all_flushed());
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kYes);
}

TEST_CASE("Within its back-off, a device that missed the deadline is drained without a marker",
          "[engine]") {
  MarkerRig m;
  m.device().marker_flush = vf::failover::Device::MarkerFlush::kNo;
  m.device().marker_retry_at_ns = vf::monotonic_ns() + 60'000'000'000ull;
  m.drain();
  CHECK(g_marker.markers_posted == 0);
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kNo);
}

TEST_CASE("A drain starved of the CPU past its deadline looks once more before giving up",
          "[engine]") {
  MarkerRig m;
  g_marker.starve_first_poll = true;
  m.drain();
  CHECK(g_marker.markers_posted == 1);
  CHECK(g_marker.all_flushed());
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kYes);
}

TEST_CASE("Each deadline missed in a row doubles the device's back-off, up to a bound",
          "[engine]") {
  MarkerRig m;
  g_marker.flush_after_polls = -1;  // a dead device: the flush never comes
  std::uint64_t previous = 0;
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    m.device().marker_retry_at_ns = 0;  // due again (the test does not wait out the back-off)
    const std::uint64_t before = vf::monotonic_ns();
    m.drain();
    CHECK(g_marker.markers_posted == round + 1);
    REQUIRE(m.device().marker_flush == vf::failover::Device::MarkerFlush::kNo);
    const std::uint64_t backoff = m.device().marker_backoff_ns;
    CHECK(backoff == (round == 0 ? vf::failover::kMarkerRetryFirstNs : 2 * previous));
    CHECK(m.device().marker_retry_at_ns >= before + backoff);
    previous = backoff;
  }
  m.device().marker_backoff_ns = vf::failover::kMarkerRetryMaxNs;
  m.device().marker_retry_at_ns = 0;
  m.drain();
  CHECK(m.device().marker_backoff_ns == vf::failover::kMarkerRetryMaxNs);
  // A flush that comes again ends the back-off.
  g_marker.flush_after_polls = 0;
  m.device().marker_retry_at_ns = 0;
  m.drain();
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kYes);
  CHECK(m.device().marker_backoff_ns == 0);
}

TEST_CASE("A late flush of an earlier drain's marker does not end a later drain early",
          "[engine]") {
  MarkerRig m;
  g_marker.flush_after_polls = -1;  // the first drain's marker is not flushed in time
  m.drain();
  REQUIRE(m.device().marker_flush == vf::failover::Device::MarkerFlush::kNo);
  // Its flush comes after all, and the next marker's never does: the next drain must wait for
  // its own, not take the old one for it.
  g_marker.flush_after_polls = 0;
  g_marker.flush_limit = 1;
  m.device().marker_retry_at_ns = 0;
  m.drain();
  CHECK(g_marker.markers_posted == 2);
  CHECK(g_marker.flushes_written == 1);
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kNo);
}

TEST_CASE("A nudge made late by a starved drain still gets its time to show the flush",
          "[engine]") {
  MarkerRig m;
  // The engine's thread is starved past the deadline before its first look; the device flushes
  // only a few polls after the second move to ERR (rxe flushes when its responder runs).
  g_marker.starve_first_poll = true;
  g_marker.flush_after_polls = 3;
  m.drain();
  CHECK(g_marker.all_flushed());
  CHECK(m.device().marker_flush == vf::failover::Device::MarkerFlush::kYes);
}
