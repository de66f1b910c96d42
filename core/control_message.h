// The wire format of the control channel between two shims (docs/design.md §5): what a standby
// pair needs to be connected, memory-registration translations, and the failover handshake.
// Every field is checked on decode: a malformed message from the network is an error with a
// precise reason, never a crash or a half-applied message.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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
  // The ECE (ibv_query_ece) of the sender's primary QP, as its application negotiated it;
  // vendor 0: none (the provider has no ECE). Both ends give their standbys the options both
  // primaries have, so the standby pair runs with what the application agreed on.
  std::uint32_t ece_vendor_id = 0;
  std::uint32_t ece_options = 0;
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
  // The sender's port GID of the device these registrations belong to (the GID its QPs on that
  // device are named by): rkeys are per device, so the same value on two devices is two keys.
  Gid device_gid{};
  bool operator==(const MrUpdate&) const = default;
};

// Sent first by both ends of every connection: who this shim is and where it can be reached, so
// the channel survives the loss of the rail it was first opened on.
struct Hello {
  std::uint64_t process_token = 0;          // random per process: tells sessions of one peer apart
  std::uint32_t pid = 0;                    // for log lines only
  std::uint16_t port = 0;                   // the sender's listening port
  std::vector<std::uint32_t> addresses;     // IPv4, network byte order; management first
  bool operator==(const Hello&) const = default;
};

// Answer to a PairRequest the receiver cannot take: the QP is not this process's, or it is but
// has no standby (no backup device, creation failed). reason is a PairRefusal.
struct PairRefused {
  QpKey local;   // the refuser's view: the key it was asked about
  QpKey remote;
  std::uint32_t reason = 0;
  bool operator==(const PairRefused&) const = default;
};
enum class PairRefusal : std::uint32_t { kUnknownQp = 1, kUnprotected = 2 };

// The failover handshake (docs/design.md §5): after draining its old path, each side tells how
// many receive-consuming messages it delivered from the other on this pair, so each replays
// exactly what the other did not deliver. The side that starts a switch sends a request, the
// other joins and answers with a reply; both carry the same facts. epoch numbers the switches of
// one pair (a stale message is ignored); target_path says which path traffic moves to.
struct FailoverRequest {
  QpKey local;
  QpKey remote;
  std::uint64_t delivered_messages = 0;
  std::uint32_t reason = 0;  // FailoverReason
  std::uint32_t epoch = 0;
  std::uint8_t target_path = 0;  // PathId
  bool operator==(const FailoverRequest&) const = default;
};

struct FailoverReply {
  QpKey local;
  QpKey remote;
  std::uint64_t delivered_messages = 0;
  std::uint32_t epoch = 0;
  std::uint8_t target_path = 0;  // PathId
  bool operator==(const FailoverReply&) const = default;
};

enum class FailoverReason : std::uint32_t {
  kPortDown = 1,
  kErrorCompletion = 2,
  kPeerRequest = 3,
  kFailback = 4,
};

// Which physical QP of a pair: the application's own (primary) or the shim's (standby).
enum class PathId : std::uint8_t { kPrimary = 0, kStandby = 1 };

// Re-connecting a path that failed once its port is ACTIVE again: both ends reset their physical
// QP on that path and exchange fresh PSNs (qpn and gid are the physical QP's on that path).
struct Rearm {
  QpKey local;
  QpKey remote;
  std::uint8_t path = 0;  // PathId
  std::uint32_t qpn = 0;
  Gid gid{};
  std::uint32_t psn = 0;
  bool is_reply = false;
  // Numbers the asker's requests for this path; a reply carries its request's. A reply to an
  // older request (its answer arrived after the asker gave up and asked again) connects to a
  // QP the answerer has since reset, so it is ignored; so is a request older than one answered.
  std::uint32_t nonce = 0;
  bool operator==(const Rearm&) const = default;
};

// "My end of this pair's idle path lost its port" (up = false) or "has it again" (up = true).
// The failover handshake covers a path that carries traffic; this covers the one that waits: a
// side whose own ports are all up learns that its standby cannot be used (and says it is
// unprotected), and, when the port is back, re-arms the path at once instead of at its next retry.
// rearm_nonce numbers it against the re-arm requests (Rearm::nonce) of that path: from the side
// that asks, its latest request (a "down" older than a request answered since is stale); from
// the side that answers, the latest request it has seen (an asker whose outstanding request is
// newer lets it be answered instead of asking again).
struct PathStatus {
  QpKey local;
  QpKey remote;
  std::uint8_t path = 0;  // PathId
  bool up = false;
  std::uint32_t rearm_nonce = 0;
  bool operator==(const PathStatus&) const = default;
};

// "My QP of this pair is failed for good" (its application has seen it fail, or took it down):
// the pair is over, and the receiver stops asking (switches, re-arms, path news) and stops
// waiting. Sent once when the sender's QP fails for good, and again as the answer to any
// request about that QP, so that a peer that missed it does not wait for an answer that will
// never come.
struct PairEnded {
  QpKey local;  // the sender's QP, failed for good
  QpKey remote;
  bool operator==(const PairEnded&) const = default;
};

// "Send me the translation of this rkey of yours" — a registration the application used on the
// standby path before the peer's MrUpdate arrived. Answered with an MrUpdate.
struct MrQuery {
  std::uint32_t primary_rkey = 0;
  Gid device_gid{};  // the queried side's device, as its QPs are named (MrUpdate)
  bool operator==(const MrQuery&) const = default;
};

// "My application disconnected this rdma_cm connection (rdma_disconnect)": the receiver's shim
// gives its application the RDMA_CM_EVENT_DISCONNECTED the CM's DREQ would have brought, for
// that request travels over the primary path, which may be dead (rdma_cm is not protected).
// Answered with is_reply set; the asker resends until answered or its bound passes.
struct CmDisconnect {
  QpKey local;  // the sender's QP
  QpKey remote;
  bool is_reply = false;
  bool operator==(const CmDisconnect&) const = default;
};

using ControlMessage = std::variant<PairRequest, PairReply, MrUpdate, FailoverRequest, FailoverReply,
                                    Hello, PairRefused, Rearm, MrQuery, PathStatus, PairEnded,
                                    CmDisconnect>;
// The alternatives' names, in the variant's order (log lines, the tests' fault injection).
inline constexpr std::array<std::string_view, std::variant_size_v<ControlMessage>>
    kControlMessageNames = {"PairRequest", "PairReply",   "MrUpdate", "FailoverRequest",
                            "FailoverReply", "Hello",     "PairRefused", "Rearm",
                            "MrQuery",     "PathStatus",  "PairEnded",
                            "CmDisconnect"};

inline constexpr std::uint32_t kControlMagic = 0x4D434656;  // "VFCM" little-endian
inline constexpr std::uint16_t kControlVersion = 8;
inline constexpr std::size_t kControlHeaderSize = 12;       // magic, version, type, length
inline constexpr std::size_t kMaxControlPayload = 64 * 1024;
inline constexpr std::size_t kMaxRegistrationsPerMessage = 2048;
inline constexpr std::size_t kMaxAddresses = 64;  // per Hello
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
