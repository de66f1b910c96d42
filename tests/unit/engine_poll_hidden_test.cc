// A poll returns 0 only when nothing of the application's is left (issue 19 item 4 b): the
// provider's CQ may hold the application's completions behind completions the shim hides (drain
// markers, a left path's flushes), and an application that arms its CQ and sleeps after a 0
// would strand them. On the rig of tests/unit/engine_rig.h, with a provider CQ the test fills.
#include <deque>
#include <vector>

#include "core/datapath_registries.h"
#include "tests/unit/engine_rig.h"

namespace {

std::deque<ibv_wc> g_provider_cq;  // what the provider's CQ holds, oldest first
int g_provider_polls = 0;

int provider_poll(ibv_cq*, int num_entries, ibv_wc* wc) {
  ++g_provider_polls;
  int n = 0;
  for (; n < num_entries && !g_provider_cq.empty(); ++n) {
    wc[n] = g_provider_cq.front();
    g_provider_cq.pop_front();
  }
  return n;
}

ibv_wc completion(std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = 17;
  return wc;
}
// A drain marker's flush: the shim's, never the application's.
ibv_wc marker_flush() {
  return completion(vf::kDrainMarkerWrId, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
}

struct PollRig {
  Rig rig;
  ibv_context_ops saved = g_ops;
  const void* key = vf::qpn_registry_key(0, 17);

  PollRig() {
    g_provider_cq.clear();
    g_provider_polls = 0;
    g_ops.poll_cq = provider_poll;
    REQUIRE(vf::datapath_registries::qps_by_qpn.insert(key, rig.v));
  }
  ~PollRig() {
    vf::datapath_registries::qps_by_qpn.erase(key);
    g_ops = saved;
  }
  PollRig(const PollRig&) = delete;
  PollRig& operator=(const PollRig&) = delete;
};

}  // namespace

TEST_CASE("A poll of one entry does not return 0 over a hidden completion", "[engine]") {
  PollRig r;
  r.rig.post_recv(0x71);
  g_provider_cq.push_back(marker_flush());
  g_provider_cq.push_back(completion(0x71, IBV_WC_SUCCESS, IBV_WC_RECV));
  ibv_wc wc{};
  REQUIRE(r.rig.cq_state->poll(1, &wc) == 1);
  CHECK(wc.wr_id == 0x71);
  CHECK(g_provider_cq.empty());
}

TEST_CASE("A poll returns 0 over a full batch of hidden completions only when the CQ is dry",
          "[engine]") {
  PollRig r;
  r.rig.post_recv(0x81);
  for (int i = 0; i < 8; ++i) g_provider_cq.push_back(marker_flush());
  g_provider_cq.push_back(completion(0x81, IBV_WC_SUCCESS, IBV_WC_RECV));
  ibv_wc wc[4]{};
  REQUIRE(r.rig.cq_state->poll(4, wc) == 1);
  CHECK(wc[0].wr_id == 0x81);
  // Nothing left: 0, after one look at the dry CQ.
  g_provider_polls = 0;
  CHECK(r.rig.cq_state->poll(4, wc) == 0);
  CHECK(g_provider_polls == 1);
}

TEST_CASE("A merged poll (the stash in use) does not return 0 over hidden completions",
          "[engine]") {
  PollRig r;
  r.rig.post_recv(0x91);
  r.rig.cq_state->shadow_active.store(true);  // the cold path: the shadow is polled too
  for (int i = 0; i < 3; ++i) g_provider_cq.push_back(marker_flush());
  g_provider_cq.push_back(completion(0x91, IBV_WC_SUCCESS, IBV_WC_RECV));
  ibv_wc wc[2]{};
  REQUIRE(r.rig.cq_state->poll(2, wc) == 1);
  CHECK(wc[0].wr_id == 0x91);
}
