#include <catch2/catch.hpp>

#include <vector>

#include "core/receive_ring.h"

namespace {
int post(vf::ReceiveRing& ring, std::uint64_t wr_id, int num_sge = 1) {
  // As many SGEs as the request claims (up to 4), like an application's request.
  ibv_sge sge[4] = {{0x1000 + wr_id, 64, 7}, {0x2000 + wr_id, 64, 7}, {}, {}};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = num_sge ? sge : nullptr;
  wr.num_sge = num_sge;
  return ring.record(wr);
}

std::vector<std::uint64_t> pending_ids(const vf::ReceiveRing& ring) {
  std::vector<std::uint64_t> out;
  ring.for_each_pending([&](const vf::ReceiveRecord& r, const ibv_sge*) { out.push_back(r.wr_id); });
  return out;
}
}  // namespace

TEST_CASE("receives are consumed in posting order and counted as delivered messages") {
  vf::ReceiveRing ring(8, 1);
  for (std::uint64_t id = 1; id <= 3; ++id) REQUIRE(post(ring, id) == 0);
  REQUIRE(ring.consume_oldest(1));
  REQUIRE(ring.consume_oldest(2));
  CHECK(ring.delivered_messages() == 2);
  CHECK(pending_ids(ring) == std::vector<std::uint64_t>{3});
}

TEST_CASE("zero-SGE receives (NCCL's) are kept, SGEs are kept for re-posting") {
  vf::ReceiveRing ring(4, 1);
  REQUIRE(post(ring, 10, 0) == 0);
  REQUIRE(post(ring, 11, 1) == 0);
  std::vector<std::uint32_t> sges;
  std::vector<std::uint64_t> addrs;
  ring.for_each_pending([&](const vf::ReceiveRecord& r, const ibv_sge* sge) {
    sges.push_back(r.num_sge);
    if (r.num_sge) addrs.push_back(sge[0].addr);
  });
  CHECK(sges == std::vector<std::uint32_t>{0, 1});
  CHECK(addrs == std::vector<std::uint64_t>{0x1000 + 11});
}

TEST_CASE("an unexpected completion is refused, not miscounted") {
  vf::ReceiveRing ring(4, 1);
  CHECK_FALSE(ring.consume_oldest(1));  // nothing pending
  REQUIRE(post(ring, 1) == 0);
  CHECK_FALSE(ring.consume_oldest(2));  // out of order: not what RC does
  CHECK(ring.delivered_messages() == 0);
  CHECK(ring.pending() == 1);
}

TEST_CASE("a full receive ring refuses like a full receive queue") {
  vf::ReceiveRing ring(2, 1);
  REQUIRE(post(ring, 1) == 0);
  REQUIRE(post(ring, 2) == 0);
  CHECK(post(ring, 3) == ENOMEM);
  REQUIRE(ring.consume_oldest(1));
  CHECK(post(ring, 3, 2) == EINVAL);
  CHECK(post(ring, 3) == 0);
  CHECK(pending_ids(ring) == std::vector<std::uint64_t>{2, 3});
}
