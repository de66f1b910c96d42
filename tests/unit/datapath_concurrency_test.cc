// Posts and polls of one protected QP on different threads at the same time (core/virtual_qp.h:
// a post records in the QP's rings under the QP's lock; a poll retires from them under the CQ's
// lock and then the QP's). These tests run exactly that, many times over, with rings small
// enough to be full and empty all the time, and check what the application would see: every
// completion once, in order, and rings that end empty. They are also built with
// ThreadSanitizer (ctest datapath_concurrency_tsan), which reports any access to the rings or
// the QP's state that the locks do not order.
//
// The provider here is a FAKE written for this test (no NIC, no libibverbs): its post_send turns
// every signaled request into a successful completion and its post_recv completes each receive
// at once (as if a message were waiting), on a mutex-protected queue per CQ that its poll_cq
// takes from.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/datapath_registries.h"
#include "core/virtual_qp.h"

namespace {

struct FakeCq {
  ibv_cq cq{};
  std::mutex mutex;
  std::deque<ibv_wc> completions;
};

FakeCq* g_send_cq = nullptr;
FakeCq* g_recv_cq = nullptr;

int fake_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr**) {
  std::lock_guard lock(g_send_cq->mutex);
  for (; wr != nullptr; wr = wr->next) {
    if (!(wr->send_flags & IBV_SEND_SIGNALED)) continue;
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RDMA_WRITE;
    wc.qp_num = qp->qp_num;
    g_send_cq->completions.push_back(wc);
  }
  return 0;
}

int fake_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr**) {
  std::lock_guard lock(g_recv_cq->mutex);
  for (; wr != nullptr; wr = wr->next) {
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.byte_len = 64;
    wc.qp_num = qp->qp_num;
    g_recv_cq->completions.push_back(wc);
  }
  return 0;
}

int fake_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  FakeCq* fake = cq == &g_send_cq->cq ? g_send_cq : g_recv_cq;
  std::lock_guard lock(fake->mutex);
  int polled = 0;
  while (polled < num_entries && !fake->completions.empty()) {
    wc[polled++] = fake->completions.front();
    fake->completions.pop_front();
  }
  return polled;
}

using Clock = std::chrono::steady_clock;

struct Run {
  std::uint64_t sends = 0;
  std::uint64_t receives = 0;
  bool split_cq = false;
};

struct Seen {
  std::vector<std::uint64_t> send_ids;  // signaled send completions, in polling order
  std::vector<std::uint64_t> recv_ids;
  int poll_errors = 0;
  int foreign = 0;  // a completion the application must not see (wrong QP, hidden)
};

constexpr std::uint32_t kQpn = 0x77;
constexpr int kDevice = 0;

// Polls `cq` until `want_sends` send and `want_recvs` receive completions came, or the deadline.
void poll_until(vf::CqState& cq, std::uint64_t want_sends, std::uint64_t want_recvs, Seen& seen,
                Clock::time_point deadline) {
  ibv_wc wc[8];
  while ((seen.send_ids.size() < want_sends || seen.recv_ids.size() < want_recvs) &&
         Clock::now() < deadline) {
    const int polled = cq.poll(8, wc);
    if (polled < 0) {
      ++seen.poll_errors;
      return;
    }
    if (polled == 0) std::this_thread::yield();  // let the poster run on a loaded machine
    for (int i = 0; i < polled; ++i) {
      if (wc[i].qp_num != kQpn || wc[i].status != IBV_WC_SUCCESS) {
        ++seen.foreign;
      } else if (wc[i].opcode == IBV_WC_RECV) {
        seen.recv_ids.push_back(wc[i].wr_id);
      } else {
        seen.send_ids.push_back(wc[i].wr_id);
      }
    }
  }
}

void run(const Run& r) {
  FakeCq send_fake, recv_fake;
  g_send_cq = &send_fake;
  g_recv_cq = r.split_cq ? &recv_fake : &send_fake;
  ibv_context_ops ops{};
  ops.post_send = fake_post_send;
  ops.post_recv = fake_post_recv;
  ops.poll_cq = fake_poll_cq;
  ibv_qp app_qp{};
  app_qp.qp_num = kQpn;
  ibv_qp_cap cap{};
  cap.max_send_wr = 16;  // small: the poster finds the ring full again and again
  cap.max_recv_wr = 8;
  cap.max_send_sge = 1;
  cap.max_recv_sge = 1;
  cap.max_inline_data = 16;
  auto send_cq = std::make_unique<vf::CqState>(&send_fake.cq, kDevice, &ops, 64);
  auto recv_cq = r.split_cq ? std::make_unique<vf::CqState>(&recv_fake.cq, kDevice, &ops, 64)
                            : nullptr;
  vf::CqState* rcq = r.split_cq ? recv_cq.get() : send_cq.get();
  auto qp = std::make_unique<vf::VirtualQp>(&app_qp, &ops, cap, false, send_cq.get(), rcq);
  const void* key = vf::qpn_registry_key(kDevice, kQpn);
  REQUIRE(vf::datapath_registries::qps_by_qpn.insert(key, qp.get()));

  // Every 4th send is signaled, and the last; unsignaled ones retire with the next signaled.
  std::vector<std::uint64_t> signaled;
  for (std::uint64_t i = 0; i < r.sends; ++i) {
    if (i % 4 == 3 || i + 1 == r.sends) signaled.push_back(i);
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  std::atomic<int> post_errors{0};
  std::atomic<bool> poster_timed_out{false};

  // A post's result: taken (the next one is due), ENOMEM (the ring is full until the poller
  // retires; the CPU is given away, as an application waiting for completions would, so that a
  // loaded machine cannot starve the poller), or an error (counted; the poster stops).
  auto accepted = [&](int result, std::uint64_t& next) {
    if (result == 0) {
      ++next;
    } else if (result == ENOMEM) {
      std::this_thread::yield();
    } else {
      ++post_errors;
      return false;
    }
    return true;
  };
  std::thread poster([&] {
    std::uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::uint64_t next_send = 0, next_recv = 0;
    while ((next_send < r.sends || next_recv < r.receives) && Clock::now() < deadline) {
      if (next_send < r.sends) {
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(payload), sizeof payload, 0};
        ibv_send_wr wr{};
        wr.wr_id = next_send;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_INLINE;
        if (next_send % 4 == 3 || next_send + 1 == r.sends) wr.send_flags |= IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        if (!accepted(qp->post_send(&wr, &bad), next_send)) return;
      }
      if (next_recv < r.receives) {
        ibv_sge sge{0x1000, 64, 0};
        ibv_recv_wr wr{};
        wr.wr_id = next_recv;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (!accepted(qp->post_recv(&wr, &bad), next_recv)) return;
      }
    }
    if (next_send < r.sends || next_recv < r.receives) poster_timed_out = true;
  });

  Seen on_send_cq, on_recv_cq;
  if (r.split_cq) {
    std::thread recv_poller([&] { poll_until(*rcq, 0, r.receives, on_recv_cq, deadline); });
    poll_until(*send_cq, signaled.size(), 0, on_send_cq, deadline);
    recv_poller.join();
  } else {
    poll_until(*send_cq, signaled.size(), r.receives, on_send_cq, deadline);
  }
  poster.join();
  vf::datapath_registries::qps_by_qpn.erase(key);

  const Seen& sends = on_send_cq;
  const Seen& recvs = r.split_cq ? on_recv_cq : on_send_cq;
  CHECK(post_errors == 0);
  CHECK_FALSE(poster_timed_out);
  CHECK(on_send_cq.poll_errors + on_recv_cq.poll_errors == 0);
  CHECK(on_send_cq.foreign + on_recv_cq.foreign == 0);
  CHECK(sends.send_ids == signaled);  // each once, in posting order
  std::vector<std::uint64_t> expected_recvs(r.receives);
  for (std::uint64_t i = 0; i < r.receives; ++i) expected_recvs[i] = i;
  CHECK(recvs.recv_ids == expected_recvs);
  if (r.split_cq) CHECK(on_recv_cq.send_ids.empty());
  // Every request retired, every receive consumed and counted: nothing left to replay.
  CHECK(qp->send_ring().outstanding() == 0);
  CHECK(qp->recv_ring().pending() == 0);
  CHECK(qp->recv_ring().delivered_messages() == r.receives);
}

}  // namespace

TEST_CASE("a poll on one thread retires what a post on another records, with one CQ") {
  run({.sends = 20000, .receives = 5000, .split_cq = false});
}

TEST_CASE("send and receive CQs polled by two threads while a third posts") {
  run({.sends = 20000, .receives = 5000, .split_cq = true});
}
