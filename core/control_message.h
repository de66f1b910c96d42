// The wire format of the control channel between two shims (docs/design.md §5): what a standby
// pair needs to be connected, memory-registration translations, and the failover handshake.
// Every field is checked on decode: a malformed message from the network is an error with a
// precise reason, never a crash or a half-applied message.
// Part of the failover work (issue "Transparent failover"); not used by the shim yet.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace vf {

using Gid = std::array<std::uint8_t, 16>;

// Identifies one application QP across both shims: the application's own QPN and port GID (the
// values the application exchanged out of band, so both shims can name the pair alike).
struct QpKey {
  std::uint32_t qpn = 0;
  Gid gid{};
  bool operator==(const QpKey&) const = default;
};

// One registration as the peer must translate it: an rkey the application got from the primary
// device, and the rkey of the same memory on the standby device.
struct MrTranslation {
  std::uint64_t address = 0;
  std::uint64_t length = 0;
  std::uint32_t primary_rkey = 0;
  std::uint32_t standby_rkey = 0;
  bool operator==(const MrTranslation&) const = default;
};

// "My application QP `local` talks to your `remote`; here is my standby QP for the pair."
struct PairRequest {
  QpKey local;
  QpKey remote;
  std::uint32_t standby_qpn = 0;
  Gid standby_gid{};
  std::uint32_t standby_psn = 0;
  std::uint8_t path_mtu = 0;  // enum ibv_mtu
  std::vector<MrTranslation> registrations;
  bool operator==(const PairRequest&) const = default;
};

// Same contents, answering a PairRequest (the receiver's standby side of the pair).
struct PairReply {
  PairRequest pair;
  bool operator==(const PairReply&) const = default;
};

// Registrations made (or removed: length 0) after pairing, pushed to connected peers.
struct MrUpdate {
  std::vector<MrTranslation> registrations;
  bool operator==(const MrUpdate&) const = default;
};

// The failover handshake: each side tells how many receive-consuming messages it delivered from
// the other on this pair, so each replays exactly what the other did not deliver.
struct FailoverRequest {
  QpKey local;
  QpKey remote;
  std::uint64_t delivered_messages = 0;
  std::uint32_t reason = 0;  // FailoverReason
  bool operator==(const FailoverRequest&) const = default;
};

struct FailoverReply {
  QpKey local;
  QpKey remote;
  std::uint64_t delivered_messages = 0;
  bool operator==(const FailoverReply&) const = default;
};

enum class FailoverReason : std::uint32_t { kPortDown = 1, kErrorCompletion = 2, kPeerRequest = 3 };

using ControlMessage =
    std::variant<PairRequest, PairReply, MrUpdate, FailoverRequest, FailoverReply>;

inline constexpr std::uint32_t kControlMagic = 0x4D434656;  // "VFCM" little-endian
inline constexpr std::uint16_t kControlVersion = 1;
inline constexpr std::size_t kControlHeaderSize = 12;       // magic, version, type, length
inline constexpr std::size_t kMaxControlPayload = 64 * 1024;
inline constexpr std::size_t kMaxRegistrationsPerMessage = 2048;
static_assert(kMaxRegistrationsPerMessage * 24 + 256 <= kMaxControlPayload,
              "a full registration batch must fit one message");

// Appends one framed message to `out`.
void encode_control_message(const ControlMessage& message, std::vector<std::uint8_t>& out);

struct DecodeResult {
  enum class Status { kMessage, kNeedMoreBytes, kError } status = Status::kError;
  ControlMessage message;
  std::size_t consumed = 0;  // bytes of the input that formed this message
  std::string error;         // with kError: what is wrong, for the log line
};

// Decodes the first message at the start of `bytes` (a stream may hold several, or part of one).
DecodeResult decode_control_message(std::span<const std::uint8_t> bytes);

}  // namespace vf
