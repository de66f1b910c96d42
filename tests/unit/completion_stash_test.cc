// The completion stash of a protected CQ (core/virtual_qp.h, CqState): what the engine's drain
// of an old path and its own completions put ahead of the application's CQ. Issue 19 item 9: a
// drain that stopped when the stash was full left completions in the old path's CQ, which stops
// being accepted right after (hidden for good); the engine's own completions were dropped with an
// error line once the stash was full. Now the stash grows: nothing is ever left or dropped.
//
// The provider is a FAKE written for this test: its poll_cq hands out `g_pending` successful
// send completions of a QP the shim does not know (kept for the application as they are),
// numbered by wr_id.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/virtual_qp.h"

namespace {

int g_pending = 0;
std::uint64_t g_next_wr_id = 0;

int fake_poll_cq(ibv_cq*, int num_entries, ibv_wc* wc) {
  int n = 0;
  for (; n < num_entries && g_pending > 0; ++n, --g_pending) {
    wc[n] = ibv_wc{};
    wc[n].wr_id = g_next_wr_id++;
    wc[n].status = IBV_WC_SUCCESS;
    wc[n].opcode = IBV_WC_SEND;
    wc[n].qp_num = 4242;  // no protected QP has it: the application's as it is
  }
  return n;
}

const ibv_context_ops g_ops = [] {
  ibv_context_ops ops{};
  ops.poll_cq = fake_poll_cq;
  return ops;
}();

// Everything the application's polls return, until one returns 0.
std::vector<std::uint64_t> poll_all(vf::CqState& state) {
  std::vector<std::uint64_t> out;
  ibv_wc wc[7];
  for (int n; (n = state.poll(7, wc)) > 0;) {
    for (int i = 0; i < n; ++i) out.push_back(wc[i].wr_id);
  }
  return out;
}

}  // namespace

TEST_CASE("A drain takes every completion of the old path, more than the stash was made for",
          "[stash]") {
  ibv_cq cq{};
  cq.cqe = 8;
  vf::CqState state(&cq, 0, &g_ops, 2 * 8 + 16);  // 32: as a CQ of 8 entries gets
  g_pending = 100;  // a flush storm: several QPs' queues on one CQ
  g_next_wr_id = 0;
  state.drain_into_stash(vf::kPrimary);
  CHECK(g_pending == 0);  // nothing left behind in the provider's CQ
  CHECK(state.stash.size() == 100);
  const std::vector<std::uint64_t> seen = poll_all(state);
  REQUIRE(seen.size() == 100);
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);  // in order, once each
}

TEST_CASE("The engine's own completions are never dropped for want of room", "[stash]") {
  ibv_cq cq{};
  cq.cqe = 4;
  vf::CqState state(&cq, 0, &g_ops, 8);
  g_pending = 0;
  for (std::uint64_t i = 0; i < 50; ++i) {
    ibv_wc wc{};
    wc.wr_id = 1000 + i;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = 4242;
    state.lock.lock();
    CHECK(state.stash_for_application(wc));
    state.lock.unlock();
  }
  const std::vector<std::uint64_t> seen = poll_all(state);
  REQUIRE(seen.size() == 50);
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == 1000 + i);
}
