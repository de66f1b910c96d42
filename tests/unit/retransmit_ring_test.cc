#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "core/retransmit_ring.h"

namespace {

struct Poster {
  vf::RetransmitRing& ring;
  std::vector<std::uint8_t> buffer = std::vector<std::uint8_t>(4096, 0);
  ibv_sge sge{};

  int post(std::uint64_t wr_id, ibv_wr_opcode opcode, unsigned flags = 0, std::uint32_t length = 8) {
    sge = {reinterpret_cast<std::uintptr_t>(buffer.data()), length, 0x11};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = opcode;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = flags;
    return ring.record(wr);
  }
};

std::vector<std::uint64_t> ids(const std::vector<const vf::SendRecord*>& records) {
  std::vector<std::uint64_t> out;
  for (const auto* r : records) out.push_back(r->wr.wr_id);
  return out;
}

using Ids = std::vector<std::uint64_t>;

}  // namespace

TEST_CASE("records keep posting order, a signaled completion retires everything up to it") {
  vf::RetransmitRing ring(8, 1, 64);
  Poster p{ring};
  for (std::uint64_t i = 1; i <= 4; ++i) REQUIRE(p.post(i, IBV_WR_RDMA_WRITE) == 0);
  REQUIRE(p.post(5, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED) == 0);
  CHECK(ring.outstanding() == 5);
  CHECK(ring.messages_posted() == 1);
  ring.retire_through(5);
  CHECK(ring.outstanding() == 0);
}

TEST_CASE("a full ring refuses like a full send queue, retiring makes room") {
  vf::RetransmitRing ring(4, 1, 0);
  Poster p{ring};
  for (std::uint64_t i = 1; i <= 4; ++i) REQUIRE(p.post(i, IBV_WR_SEND) == 0);
  CHECK(p.post(5, IBV_WR_SEND) == ENOMEM);
  ring.retire_through(2);
  CHECK(p.post(5, IBV_WR_SEND) == 0);
  CHECK(p.post(6, IBV_WR_SEND) == 0);
  CHECK(p.post(7, IBV_WR_SEND) == ENOMEM);
  CHECK(ring.outstanding() == 4);
}

TEST_CASE("requests beyond the QP's SGE or inline limits are refused") {
  vf::RetransmitRing ring(4, 1, 16);
  Poster p{ring};
  CHECK(p.post(1, IBV_WR_SEND, IBV_SEND_INLINE, 17) == EINVAL);
  CHECK(p.post(1, IBV_WR_SEND, IBV_SEND_INLINE, 16) == 0);
  ibv_sge two[2]{};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = two;
  wr.num_sge = 2;
  CHECK(ring.record(wr) == EINVAL);
}

TEST_CASE("requests no other device could execute are not recorded (issue 19 item 8)") {
  vf::RetransmitRing ring(4, 1, 16);
  Poster p{ring};
  for (const ibv_wr_opcode opcode : {IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV,
                                     IBV_WR_TSO, IBV_WR_DRIVER1, IBV_WR_ATOMIC_WRITE}) {
    CAPTURE(opcode);
    CHECK(p.post(1, opcode) == vf::RetransmitRing::kNotReplayable);
  }
  CHECK(ring.outstanding() == 0);
  CHECK(ring.messages_posted() == 0);
  for (const ibv_wr_opcode opcode :
       {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM}) {
    CHECK(p.post(2, opcode) == 0);
  }
  CHECK(ring.outstanding() == 4);
}

TEST_CASE("inline payloads are copied: the application may reuse its buffer at once") {
  vf::RetransmitRing ring(4, 1, 64);
  Poster p{ring};
  std::memcpy(p.buffer.data(), "payload!", 8);
  REQUIRE(p.post(1, IBV_WR_SEND, IBV_SEND_INLINE | IBV_SEND_SIGNALED, 8) == 0);
  std::memset(p.buffer.data(), 0xEE, 8);
  std::vector<const vf::SendRecord*> replay, unrecoverable;
  REQUIRE(ring.replay_set(0, replay, unrecoverable));
  REQUIRE(replay.size() == 1);
  CHECK(replay[0]->inline_length == 8);
  CHECK(std::memcmp(ring.inline_data(*replay[0]), "payload!", 8) == 0);
  CHECK(ring.sges(*replay[0])[0].lkey == 0x11);
}

TEST_CASE("replay after a cut: exactly the messages the peer did not deliver, and the writes "
          "after the last one it did") {
  vf::RetransmitRing ring(32, 1, 0);
  Poster p{ring};
  // NCCL's pattern, twice: unsignaled writes, then a signaled write-with-immediate.
  p.post(1, IBV_WR_RDMA_WRITE);
  p.post(2, IBV_WR_RDMA_WRITE);
  p.post(3, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED);  // message 1
  p.post(4, IBV_WR_RDMA_WRITE);
  p.post(5, IBV_WR_RDMA_WRITE);
  p.post(6, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED);  // message 2
  p.post(7, IBV_WR_SEND, IBV_SEND_SIGNALED);                 // message 3
  std::vector<const vf::SendRecord*> replay, unrecoverable;

  SECTION("cut before anything arrived") {
    REQUIRE(ring.replay_set(0, replay, unrecoverable));
    CHECK(ids(replay) == Ids{1, 2, 3, 4, 5, 6, 7});
  }
  SECTION("cut after the first write-with-imm was delivered but before its ACK came back") {
    REQUIRE(ring.replay_set(1, replay, unrecoverable));
    CHECK(ids(replay) == Ids{4, 5, 6, 7});
  }
  SECTION("cut after the second write-with-imm arrived: only the SEND is left") {
    REQUIRE(ring.replay_set(2, replay, unrecoverable));
    CHECK(ids(replay) == Ids{7});
  }
  SECTION("the first completion was seen: retired entries are never replayed") {
    ring.retire_through(3);
    CHECK(ring.outstanding() == 4);
    REQUIRE(ring.replay_set(1, replay, unrecoverable));
    CHECK(ids(replay) == Ids{4, 5, 6, 7});
  }
  SECTION("everything delivered, only ACKs lost") {
    REQUIRE(ring.replay_set(3, replay, unrecoverable));
    CHECK(replay.empty());
  }
  SECTION("a peer claiming more than was sent is a protocol error") {
    CHECK_FALSE(ring.replay_set(4, replay, unrecoverable));
  }
  CHECK(unrecoverable.empty());
}

TEST_CASE("reads are always replayed, atomics are never replayed but reported") {
  vf::RetransmitRing ring(16, 1, 0);
  Poster p{ring};
  p.post(1, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED);
  p.post(2, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED);
  p.post(3, IBV_WR_SEND, IBV_SEND_SIGNALED);  // message 1, delivered
  std::vector<const vf::SendRecord*> replay, unrecoverable;
  REQUIRE(ring.replay_set(1, replay, unrecoverable));
  CHECK(ids(replay) == Ids{1});
  CHECK(ids(unrecoverable) == Ids{2});
}

TEST_CASE("sequence numbers survive wrapping around the ring many times") {
  vf::RetransmitRing ring(4, 1, 0);
  Poster p{ring};
  for (std::uint64_t i = 1; i <= 1000; ++i) {
    REQUIRE(p.post(i, IBV_WR_SEND, IBV_SEND_SIGNALED) == 0);
    if (i % 3 == 0) ring.retire_through(ring.last_sequence());
    if (ring.outstanding() == ring.capacity()) ring.retire_through(ring.last_sequence() - 1);
  }
  std::vector<const vf::SendRecord*> replay, unrecoverable;
  REQUIRE(ring.replay_set(ring.messages_posted() - ring.outstanding(), replay, unrecoverable));
  REQUIRE(replay.size() == ring.outstanding());
  CHECK(replay.back()->wr.wr_id == 1000);
  CHECK(replay.back()->sequence == 1000);
}
