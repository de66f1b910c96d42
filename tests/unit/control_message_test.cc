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
  pair.ece_vendor_id = 0x15b3;
  pair.ece_options = 0x10000001;
  pair.registrations = {{0x7f0000001000, 65536, 0x1234, 0x5678}, {0x7f0000100000, 4096, 9, 10}};
  return pair;
}

vf::Hello sample_hello() {
  vf::Hello hello;
  hello.process_token = 0x0123456789ABCDEFull;
  hello.pid = 4711;
  hello.port = 18515;
  hello.addresses = {0x0100000A, 0x0200000A, 0x0112C6C6};
  return hello;
}

vf::Rearm sample_rearm() {
  vf::Rearm rearm;
  rearm.local = {0x11, gid_of(1)};
  rearm.remote = {0x22, gid_of(2)};
  rearm.path = static_cast<std::uint8_t>(vf::PathId::kPrimary);
  rearm.qpn = 0x44;
  rearm.gid = gid_of(4);
  rearm.psn = 0x123456;
  rearm.is_reply = true;
  rearm.nonce = 0xA1B2C3D4;
  return rearm;
}

vf::PathStatus sample_path_status() {
  vf::PathStatus status;
  status.local = {0x11, gid_of(1)};
  status.remote = {0x22, gid_of(2)};
  status.path = static_cast<std::uint8_t>(vf::PathId::kStandby);
  status.up = false;
  status.rearm_nonce = 0x01020304;
  return status;
}

vf::FailoverRequest sample_failover_request() {
  return vf::FailoverRequest{{0x11, gid_of(1)}, {0x22, gid_of(2)}, 12345678901ull,
                             static_cast<std::uint32_t>(vf::FailoverReason::kFailback), 7,
                             static_cast<std::uint8_t>(vf::PathId::kStandby)};
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
      vf::MrUpdate{},
      vf::FailoverRequest{{0x11, gid_of(1)}, {0x22, gid_of(2)}, 12345678901ull, 1, 0, 0},
      sample_failover_request(),
      vf::FailoverReply{{0x22, gid_of(2)}, {0x11, gid_of(1)}, 42, 0xFFFFFFFFu, 1},
      vf::FailoverReply{{0x22, gid_of(2)}, {0x11, gid_of(1)}, 0, 3, 0},
      sample_hello(),
      vf::Hello{},
      vf::Hello{~0ull, 0xFFFFFFFFu, 65535, std::vector<std::uint32_t>(vf::kMaxAddresses, 0xFFFFFFFFu)},
      vf::PairRefused{{0x11, gid_of(1)}, {0x22, gid_of(2)},
                      static_cast<std::uint32_t>(vf::PairRefusal::kUnknownQp)},
      vf::PairRefused{{0x11, gid_of(1)}, {0x22, gid_of(2)},
                      static_cast<std::uint32_t>(vf::PairRefusal::kUnprotected)},
      sample_rearm(),
      vf::Rearm{{1, {}}, {2, {}}, 1, 0xFFFFFF, gid_of(9), 0, false},
      vf::MrQuery{0xDEADBEEF, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
      sample_path_status(),
      vf::PathStatus{{1, {}}, {2, {}}, 0, true, 0xFFFFFFFFu},
      vf::PairEnded{{0x11, gid_of(1)}, {0x22, gid_of(2)}},
      vf::CmDisconnect{{0x11, gid_of(1)}, {0x22, gid_of(2)}, false},
      vf::CmDisconnect{{0x11, gid_of(1)}, {0x22, gid_of(2)}, true},
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
  const auto second = encode(vf::FailoverReply{{1, {}}, {2, {}}, 7, 1, 1});
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
    bytes[4] = 9;
    CHECK(decode(bytes).error == "protocol version 9 is not supported (this shim speaks 8)");
  }
  SECTION("the previous protocol version") {
    auto bytes = good;
    bytes[4] = 7;
    CHECK(decode(bytes).error == "protocol version 7 is not supported (this shim speaks 8)");
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
    const std::size_t count_offset = vf::kControlHeaderSize + 2 * 20 + 4 + 16 + 4 + 1 + 8;
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
  SECTION("ECE options without a vendor") {
    auto bytes = good;
    const std::size_t vendor_offset = vf::kControlHeaderSize + 2 * 20 + 4 + 16 + 4 + 1;
    for (std::size_t i = 0; i < 4; ++i) bytes[vendor_offset + i] = 0;
    CHECK(decode(bytes).error ==
          "malformed message of type 1: ECE options 0x10000001 without a vendor id");
  }
  SECTION("trailing bytes inside the declared length") {
    auto bytes = good;
    bytes.push_back(0);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] + 1);
    CHECK(decode(bytes).error == "malformed message of type 1: 1 unexpected bytes after the message");
  }
  SECTION("a length that cuts a field in half") {
    auto bytes = encode(vf::FailoverRequest{{1, {}}, {2, {}}, 3, 1, 0, 0});
    // reason(4) epoch(4) target_path(1) end the payload: cut 2 bytes into the reason
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 7);
    bytes.resize(bytes.size() - 7);
    CHECK(decode(bytes).error == "malformed message of type 4: message ends inside reason");
  }
  SECTION("an unknown failover reason") {
    auto bytes = encode(vf::FailoverRequest{{1, {}}, {2, {}}, 3, 1, 0, 0});
    bytes[bytes.size() - 9] = 7;
    CHECK(decode(bytes).error == "malformed message of type 4: failover reason 7 is unknown");
    bytes[bytes.size() - 9] = 0;
    CHECK(decode(bytes).error == "malformed message of type 4: failover reason 0 is unknown");
  }
}

TEST_CASE("malformed messages of the version-2 types are rejected with a precise reason") {
  SECTION("failover request: a target path that is neither primary nor standby") {
    auto bytes = encode(sample_failover_request());
    bytes.back() = 2;
    CHECK(decode(bytes).error ==
          "malformed message of type 4: target path 2 is not a path (0 primary, 1 standby)");
  }
  SECTION("failover request without epoch and target path (a version-1 body)") {
    auto bytes = encode(sample_failover_request());
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 5);
    bytes.resize(bytes.size() - 5);
    CHECK(decode(bytes).error == "malformed message of type 4: message ends inside epoch");
  }
  SECTION("failover reply: bad target path") {
    auto bytes = encode(vf::FailoverReply{{1, {}}, {2, {}}, 3, 4, 1});
    bytes.back() = 0xFF;
    CHECK(decode(bytes).error ==
          "malformed message of type 5: target path 255 is not a path (0 primary, 1 standby)");
  }
  SECTION("failover reply: cut inside target path") {
    auto bytes = encode(vf::FailoverReply{{1, {}}, {2, {}}, 3, 4, 1});
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 1);
    bytes.resize(bytes.size() - 1);
    CHECK(decode(bytes).error == "malformed message of type 5: message ends inside target path");
  }
  SECTION("hello: too many addresses") {
    vf::Hello hello = sample_hello();
    hello.addresses.assign(vf::kMaxAddresses + 1, 1);
    const auto result = decode(encode(hello));
    CHECK(result.status == vf::DecodeResult::Status::kError);
    CHECK(result.error ==
          "malformed message of type 6: address count 65 does not fit the message (260 bytes "
          "left, at most 64 addresses)");
  }
  SECTION("hello: address count larger than the payload") {
    auto bytes = encode(sample_hello());
    bytes[vf::kControlHeaderSize + 8 + 4 + 2] = 4;  // 3 addresses follow, not 4
    CHECK(decode(bytes).error ==
          "malformed message of type 6: address count 4 does not fit the message (12 bytes "
          "left, at most 64 addresses)");
  }
  SECTION("hello: cut inside the port") {
    auto bytes = encode(vf::Hello{1, 2, 3, {}});
    bytes[8] = static_cast<std::uint8_t>(8 + 4 + 1);
    bytes.resize(vf::kControlHeaderSize + 8 + 4 + 1);
    CHECK(decode(bytes).error == "malformed message of type 6: message ends inside port");
  }
  SECTION("hello: trailing bytes") {
    auto bytes = encode(sample_hello());
    bytes.push_back(0);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] + 1);
    CHECK(decode(bytes).error == "malformed message of type 6: 1 unexpected bytes after the message");
  }
  SECTION("pair refused: unknown reason") {
    auto bytes = encode(vf::PairRefused{{1, {}}, {2, {}}, 1});
    bytes[bytes.size() - 4] = 3;
    CHECK(decode(bytes).error == "malformed message of type 7: refusal reason 3 is unknown");
    bytes[bytes.size() - 4] = 0;
    CHECK(decode(bytes).error == "malformed message of type 7: refusal reason 0 is unknown");
  }
  SECTION("pair refused: a remote QP number wider than 24 bits") {
    auto bytes = encode(vf::PairRefused{{1, {}}, {2, {}}, 1});
    bytes[vf::kControlHeaderSize + 20 + 3] = 0x80;
    CHECK(decode(bytes).error ==
          "malformed message of type 7: remote QP: QP number 0x80000002 exceeds 24 bits");
  }
  const std::size_t rearm_path = vf::kControlHeaderSize + 2 * 20;
  SECTION("rearm: path neither primary nor standby") {
    auto bytes = encode(sample_rearm());
    bytes[rearm_path] = 2;
    CHECK(decode(bytes).error ==
          "malformed message of type 8: path 2 is not a path (0 primary, 1 standby)");
  }
  SECTION("rearm: QP number wider than 24 bits") {
    auto bytes = encode(sample_rearm());
    bytes[rearm_path + 1 + 3] = 0x01;
    CHECK(decode(bytes).error ==
          "malformed message of type 8: rearm QP number 0x1000044 exceeds 24 bits");
  }
  SECTION("rearm: PSN wider than 24 bits") {
    auto bytes = encode(sample_rearm());
    bytes[rearm_path + 1 + 4 + 16 + 3] = 0x02;
    CHECK(decode(bytes).error ==
          "malformed message of type 8: rearm PSN 0x2123456 exceeds 24 bits");
  }
  SECTION("rearm: reply flag must be exactly 0 or 1") {
    auto bytes = encode(sample_rearm());
    bytes[bytes.size() - 1 - 4] = 2;  // the flag, before the nonce
    CHECK(decode(bytes).error ==
          "malformed message of type 8: reply flag 2 is not a boolean (0 or 1)");
  }
  SECTION("rearm: cut inside the GID") {
    auto bytes = encode(sample_rearm());
    const std::size_t cut = 4 + 1 + 8;  // reply flag, PSN, half of the GID
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - cut);
    bytes.resize(bytes.size() - cut);
    CHECK(decode(bytes).error == "malformed message of type 8: message ends inside rearm GID");
  }
  SECTION("mr query: empty payload") {
    auto bytes = encode(vf::MrQuery{5});
    bytes[8] = 0;
    bytes.resize(vf::kControlHeaderSize);
    CHECK(decode(bytes).error == "malformed message of type 9: message ends inside queried rkey");
  }
  SECTION("mr query: cut inside the device GID") {
    auto bytes = encode(vf::MrQuery{5});
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 3);
    bytes.resize(bytes.size() - 3);
    CHECK(decode(bytes).error == "malformed message of type 9: message ends inside device GID");
  }
  SECTION("mr update: cut inside the device GID") {
    auto bytes = encode(vf::MrUpdate{{{1, 2, 3, 4}}, {}});
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 1);
    bytes.resize(bytes.size() - 1);
    CHECK(decode(bytes).error == "malformed message of type 3: message ends inside device GID");
  }
  SECTION("mr query: trailing bytes") {
    auto bytes = encode(vf::MrQuery{5});
    bytes.insert(bytes.end(), {0, 0});
    bytes[8] = static_cast<std::uint8_t>(bytes[8] + 2);
    CHECK(decode(bytes).error == "malformed message of type 9: 2 unexpected bytes after the message");
  }
  const std::size_t status_path = vf::kControlHeaderSize + 2 * 20;
  SECTION("path status: path neither primary nor standby") {
    auto bytes = encode(sample_path_status());
    bytes[status_path] = 3;
    CHECK(decode(bytes).error ==
          "malformed message of type 10: path 3 is not a path (0 primary, 1 standby)");
  }
  SECTION("path status: up flag must be exactly 0 or 1") {
    auto bytes = encode(sample_path_status());
    bytes[status_path + 1] = 0x10;
    CHECK(decode(bytes).error ==
          "malformed message of type 10: up flag 16 is not a boolean (0 or 1)");
  }
  SECTION("path status: cut inside the nonce") {
    auto bytes = encode(sample_path_status());
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 2);
    bytes.resize(bytes.size() - 2);
    CHECK(decode(bytes).error == "malformed message of type 10: message ends inside rearm nonce");
  }
  SECTION("path status: trailing bytes") {
    auto bytes = encode(sample_path_status());
    bytes.push_back(0);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] + 1);
    CHECK(decode(bytes).error ==
          "malformed message of type 10: 1 unexpected bytes after the message");
  }
  SECTION("pair ended: truncated") {
    auto bytes = encode(vf::PairEnded{{1, {}}, {2, {}}});
    bytes.resize(bytes.size() - 1);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 1);
    CHECK(decode(bytes).error == "malformed message of type 11: message ends inside remote QP");
  }
  SECTION("rdma_cm disconnect: truncated, and a reply flag that is neither 0 nor 1") {
    auto bytes = encode(vf::CmDisconnect{{1, {}}, {2, {}}, true});
    auto flag = bytes;
    flag.back() = 2;
    CHECK(decode(flag).status == vf::DecodeResult::Status::kError);
    bytes.resize(bytes.size() - 1);
    bytes[8] = static_cast<std::uint8_t>(bytes[8] - 1);
    CHECK(decode(bytes).error == "malformed message of type 12: message ends inside reply flag");
  }
  SECTION("type 13 is still unknown") {
    auto bytes = encode(vf::MrQuery{5});
    bytes[6] = 13;
    CHECK(decode(bytes).error == "message type 13 is unknown");
  }
  SECTION("type 0 is unknown") {
    auto bytes = encode(vf::MrQuery{5});
    bytes[6] = 0;
    CHECK(decode(bytes).error == "message type 0 is unknown");
  }
}

TEST_CASE("random corruption never crashes the decoder and never yields a wrong message silently") {
  const std::vector<vf::ControlMessage> messages = {
      sample_pair(),
      vf::PairReply{sample_pair()},
      vf::MrUpdate{{{1, 2, 3, 4}, {5, 6, 7, 8}}},
      sample_failover_request(),
      vf::FailoverReply{{0x22, gid_of(2)}, {0x11, gid_of(1)}, 42, 9, 1},
      sample_hello(),
      vf::PairRefused{{0x11, gid_of(1)}, {0x22, gid_of(2)}, 2},
      sample_rearm(),
      vf::MrQuery{0x1234},
      sample_path_status(),
  };
  std::mt19937 random(12345);
  for (const auto& message : messages) {
    const auto good = encode(message);
    INFO("message type index " << message.index());
    int decoded = 0;
    for (int round = 0; round < 20000; ++round) {
      auto bytes = good;
      const int flips = 1 + static_cast<int>(random() % 4);
      for (int i = 0; i < flips; ++i) bytes[random() % bytes.size()] ^= static_cast<std::uint8_t>(1u << (random() % 8));
      if (random() % 4 == 0) bytes.resize(random() % bytes.size());
      const auto result = decode(bytes);
      if (result.status == vf::DecodeResult::Status::kMessage) {
        ++decoded;
        // A flip inside a plain value field still frames correctly; it must re-encode to the same
        // bytes it was decoded from (nothing invented, nothing dropped).
        CHECK(encode(result.message) == std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(result.consumed)));
      } else if (result.status == vf::DecodeResult::Status::kError) {
        CHECK_FALSE(result.error.empty());
      }
    }
    CHECK(decoded > 0);  // the corruption reached value fields, not only the framing
  }
}
