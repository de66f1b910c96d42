// Several threads posting and polling on different QPs at once: the fake serialises them on its
// fabric mutex, so every message arrives exactly once and in order per QP.
// (Catch assertions are not thread-safe: worker threads only count, the main thread asserts.)
#include <atomic>
#include <memory>
#include <thread>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("concurrent posters on different QPs all complete, in order per QP") {
  Clean clean;
  constexpr int kPairs = 4;
  constexpr int kMessages = 200;
  const char* devs[kPairs][2] = {
      {"fake0", "fake2"}, {"fake1", "fake3"}, {"fake2", "fake0"}, {"fake3", "fake1"}};
  QpOptions o;
  o.max_recv_wr = kMessages;  // all receives posted up front
  o.cq_size = 2 * kMessages;
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<std::unique_ptr<Region>> srcs, dsts;
  for (int i = 0; i < kPairs; ++i) {
    pairs.push_back(std::make_unique<Pair>(o, devs[i][0], devs[i][1]));
    srcs.push_back(std::make_unique<Region>(pairs[i]->a.pd, 8));
    dsts.push_back(std::make_unique<Region>(pairs[i]->b.pd, 8 * kMessages));
  }
  std::atomic<int> errors{0};
  std::vector<std::thread> receivers, senders;
  for (int i = 0; i < kPairs; ++i) {
    receivers.emplace_back([&, i] {
      Pair& p = *pairs[i];
      int seen = 0;
      for (int m = 0; m < kMessages; ++m) {
        ibv_sge sge = dsts[i]->sge(8 * m, 8);
        ibv_recv_wr wr{};
        wr.wr_id = m;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (ibv_post_recv(p.b.qp, &wr, &bad) != 0) ++errors;
      }
      for (long spins = 0; seen < kMessages && spins < 2000000; ++spins) {
        ibv_wc wc[8];
        int n = ibv_poll_cq(p.b.recv_cq, 8, wc);
        if (n < 0) ++errors;
        for (int k = 0; k < n; ++k, ++seen)
          if (wc[k].status != IBV_WC_SUCCESS || wc[k].wr_id != uint64_t(seen)) ++errors;
      }
      if (seen != kMessages) ++errors;
    });
    senders.emplace_back([&, i] {
      Pair& p = *pairs[i];
      int done = 0;
      for (int m = 0; m < kMessages; ++m) {
        uint64_t value = uint64_t(i) << 32 | uint64_t(m);
        ibv_send_wr wr{};
        ibv_sge sge{reinterpret_cast<uintptr_t>(&value), 8, 0};
        wr.wr_id = m;
        wr.opcode = IBV_WR_SEND;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        ibv_send_wr* bad = nullptr;
        // The send queue holds 16: reap before posting more.
        for (long spins = 0; m - done >= 16; ++spins) {
          if (spins > 2000000) {  // stuck: report instead of hanging the test run
            ++errors;
            return;
          }
          ibv_wc wc[8];
          int n = ibv_poll_cq(p.a.send_cq, 8, wc);
          if (n < 0) ++errors;
          for (int k = 0; k < n; ++k, ++done)
            if (wc[k].status != IBV_WC_SUCCESS) ++errors;
        }
        if (ibv_post_send(p.a.qp, &wr, &bad) != 0) ++errors;
      }
      for (long spins = 0; done < kMessages && spins < 2000000; ++spins) {
        ibv_wc wc[8];
        int n = ibv_poll_cq(p.a.send_cq, 8, wc);
        if (n < 0) ++errors;
        for (int k = 0; k < n; ++k, ++done)
          if (wc[k].status != IBV_WC_SUCCESS) ++errors;
      }
      if (done != kMessages) ++errors;
    });
  }
  for (auto& t : senders) t.join();
  for (auto& t : receivers) t.join();
  CHECK(errors.load() == 0);
  for (int i = 0; i < kPairs; ++i) {
    for (int m = 0; m < kMessages; ++m) {
      uint64_t got;
      std::memcpy(&got, dsts[i]->buf.data() + 8 * m, 8);
      REQUIRE(got == (uint64_t(i) << 32 | uint64_t(m)));
    }
    CHECK(qp_stats(pairs[i]->a.qp).messages_sent == kMessages);
  }
  dsts.clear();
  srcs.clear();
  pairs.clear();
}
