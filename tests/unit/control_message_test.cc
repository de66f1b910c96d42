#include <catch2/catch.hpp>

#include <random>

#include "core/control_message.h"

namespace {

vf::Gid gid_of(std::uint8_t last) {
  vf::Gid gid{};
  gid[10] = 0xff;
  gid[11] = 0xff;
  gid[12] = 198;
  gid[13] = 18;
  gid[14] = 1;
  gid[15] = last;
  return gid;
}

vf::PairRequest sample_pair() {
  vf::PairRequest pair;
  pair.local = {0x11, gid_of(1)};
  pair.remote = {0x22, gid_of(2)};
  pair.standby_qpn = 0x33;
  pair.standby_gid = gid_of(3);
  pair.standby_psn = 0xABCDE;
  pair.path_mtu = 3;
  pair.registrations = {{0x7f0000001000, 65536, 0x1234, 0x5678}, {0x7f0000100000, 4096, 9, 10}};
  return pair;
}

std::vector<std::uint8_t> encode(const vf::ControlMessage& message) {
  std::vector<std::uint8_t> out;
  vf::encode_control_message(message, out);
  return out;
}

vf::DecodeResult decode(const std::vector<std::uint8_t>& bytes) {
  return vf::decode_control_message(std::span<const std::uint8_t>(bytes.data(), bytes.size()));
}

}  // namespace

TEST_CASE("every message type survives encode and decode unchanged") {
  const std::vector<vf::ControlMessage> messages = {
      sample_pair(),
      vf::PairReply{sample_pair()},
      vf::MrUpdate{{{1, 2, 3, 4}}},
      vf::FailoverRequest{{0x11, gid_of(1)}, {0x22, gid_of(2)}, 12345678901ull, 1},
      vf::FailoverReply{{0x22, gid_of(2)}, {0x11, gid_of(1)}, 42},
  };
  for (const auto& message : messages) {
    const auto bytes = encode(message);
    const auto result = decode(bytes);
    INFO(result.error);
    REQUIRE(result.status == vf::DecodeResult::Status::kMessage);
    CHECK(result.consumed == bytes.size());
    CHECK(result.message == message);
  }
}

TEST_CASE("a stream with one and a half messages: the first decodes, the rest waits") {
  auto bytes = encode(sample_pair());
  const std::size_t first = bytes.size();
  const auto second = encode(vf::FailoverReply{{1, {}}, {2, {}}, 7});
  bytes.insert(bytes.end(), second.begin(), second.begin() + 5);
  auto result = decode(bytes);
  REQUIRE(result.status == vf::DecodeResult::Status::kMessage);
  CHECK(result.consumed == first);
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<long>(first));
  CHECK(decode(bytes).status == vf::DecodeResult::Status::kNeedMoreBytes);
  bytes.insert(bytes.end(), second.begin() + 5, second.end());
  result = decode(bytes);
  REQUIRE(result.status == vf::DecodeResult::Status::kMessage);
  CHECK(std::get<vf::FailoverReply>(result.message).delivered_messages == 7);
}

TEST_CASE("malformed messages are rejected with a precise reason") {
  const auto good = encode(sample_pair());

  SECTION("wrong magic: not one of ours") {
    auto bytes = good;
    bytes[0] ^= 0xFF;
    const auto result = decode(bytes);
    CHECK(result.status == vf::DecodeResult::Status::kError);
    CHECK(result.error.find("bad magic") == 0);
  }
  SECTION("future protocol version") {
    auto bytes = good;
    bytes[4] = 2;
    CHECK(decode(bytes).error == "protocol version 2 is not supported (this shim speaks 1)");
  }
  SECTION("unknown type") {
    auto bytes = good;
    bytes[6] = 99;
    CHECK(decode(bytes).error == "message type 99 is unknown");
  }
  SECTION("oversized length is refused before waiting for the bytes") {
    auto bytes = good;
    bytes[8] = 0xFF;
    bytes[9] = 0xFF;
    bytes[10] = 0xFF;
    const auto result = decode(bytes);
    CHECK(result.status == vf::DecodeResult::Status::kError);
    CHECK(result.error.find("exceeds the limit") != std::string::npos);
  }
  SECTION("registration count larger than the payload") {
    auto bytes = good;
    const std::size_t count_offset = vf::kControlHeaderSize + 2 * 20 + 4 + 16 + 4 + 1;
    bytes[count_offset] = 200;
    const auto result = decode(bytes);
    CHECK(result.status == vf::DecodeResult::Status::kError);
    CHECK(result.error.find("registration count 200 does not fit the message") !=
          std::string::npos);
  }
  SECTION("a QP number wider than 24 bits") {
    auto bytes = good;
    bytes[vf::kControlHeaderSize + 3] = 0x01;
    CHECK(decode(bytes).error ==
          "malformed message of type 1: local QP: QP number 0x1000011 exceeds 24 bits");
  }
  SECTION("an MTU that is not an ibv_mtu") {
    auto bytes = good;
    bytes[vf::kControlHeaderSize + 2 * 20 + 4 + 16 + 4] = 9;
    CHECK(decode(bytes).error == "malformed message of type 1: path MTU 9 is not an ibv_mtu (1-5)");
  }
  SECTION("trailing bytes inside the declared length") {
    auto bytes = good;
    bytes.push_back(0);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] + 1);
    CHECK(decode(bytes).error == "malformed message of type 1: 1 unexpected bytes after the message");
  }
  SECTION("a length that cuts a field in half") {
    auto bytes = encode(vf::FailoverRequest{{1, {}}, {2, {}}, 3, 1});
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 2);
    bytes.resize(bytes.size() - 2);
    CHECK(decode(bytes).error == "malformed message of type 4: message ends inside reason");
  }
  SECTION("an unknown failover reason") {
    auto bytes = encode(vf::FailoverRequest{{1, {}}, {2, {}}, 3, 1});
    bytes[bytes.size() - 4] = 7;
    CHECK(decode(bytes).error == "malformed message of type 4: failover reason 7 is unknown");
  }
}

TEST_CASE("random corruption never crashes the decoder and never yields a wrong message silently") {
  const auto good = encode(sample_pair());
  std::mt19937 random(12345);
  for (int round = 0; round < 20000; ++round) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(random() % 4);
    for (int i = 0; i < flips; ++i) bytes[random() % bytes.size()] ^= static_cast<std::uint8_t>(1u << (random() % 8));
    if (random() % 4 == 0) bytes.resize(random() % bytes.size());
    const auto result = decode(bytes);
    if (result.status == vf::DecodeResult::Status::kMessage) {
      // A flip inside a plain value field still frames correctly; it must re-encode to the same
      // bytes it was decoded from (nothing invented, nothing dropped).
      CHECK(encode(result.message) == std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(result.consumed)));
    }
  }
}
