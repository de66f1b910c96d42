#include "core/control_message.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>

namespace vf {
namespace {

enum class MessageType : std::uint16_t {
  kPairRequest = 1,
  kPairReply = 2,
  kMrUpdate = 3,
  kFailoverRequest = 4,
  kFailoverReply = 5,
  kHello = 6,
  kPairRefused = 7,
  kRearm = 8,
  kMrQuery = 9,
  kPathStatus = 10,
  kPairEnded = 11,
  kCmDisconnect = 12,
};

constexpr std::size_t kRegistrationSize = 8 + 8 + 4 + 4;

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  void u8(std::uint8_t value) { out_.push_back(value); }
  void u16(std::uint16_t value) { little_endian(value, 2); }
  void u32(std::uint32_t value) { little_endian(value, 4); }
  void u64(std::uint64_t value) { little_endian(value, 8); }
  void gid(const Gid& value) { out_.insert(out_.end(), value.begin(), value.end()); }
  void key(const QpKey& value) {
    u32(value.qpn);
    gid(value.gid);
  }
  // The pair a message is about: the sender's application QP, then the receiver's.
  template <typename Message>
  void pair_keys(const Message& value) {
    key(value.local);
    key(value.remote);
  }
  void registrations(const std::vector<MrTranslation>& list) {
    u32(static_cast<std::uint32_t>(list.size()));
    for (const MrTranslation& entry : list) {
      u64(entry.address);
      u64(entry.length);
      u32(entry.primary_rkey);
      u32(entry.standby_rkey);
    }
  }
  void hello(const Hello& value) {
    u64(value.process_token);
    u32(value.pid);
    u16(value.port);
    u32(static_cast<std::uint32_t>(value.addresses.size()));
    for (std::uint32_t address : value.addresses) u32(address);
  }
  void pair(const PairRequest& value) {
    key(value.local);
    key(value.remote);
    u32(value.standby_qpn);
    gid(value.standby_gid);
    u32(value.standby_psn);
    u8(value.path_mtu);
    u32(value.ece_vendor_id);
    u32(value.ece_options);
    registrations(value.registrations);
  }

 private:
  void little_endian(std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  }
  std::vector<std::uint8_t>& out_;
};

// Reads fields from a payload whose length the header already bounded; the first failure sticks
// and names the field.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  std::uint64_t little_endian(int width, const char* field) {
    if (!take(static_cast<std::size_t>(width), field)) return 0;
    std::uint64_t value = 0;
    for (int i = 0; i < width; ++i) value |= std::uint64_t{bytes_[offset_ - width + i]} << (8 * i);
    return value;
  }
  std::uint8_t u8(const char* field) { return static_cast<std::uint8_t>(little_endian(1, field)); }
  std::uint16_t u16(const char* field) {
    return static_cast<std::uint16_t>(little_endian(2, field));
  }
  std::uint32_t u32(const char* field) {
    return static_cast<std::uint32_t>(little_endian(4, field));
  }
  std::uint64_t u64(const char* field) { return little_endian(8, field); }
  Gid gid(const char* field) {
    Gid value{};
    if (take(value.size(), field)) std::memcpy(value.data(), &bytes_[offset_ - value.size()], value.size());
    return value;
  }
  QpKey key(const char* field) {
    QpKey value;
    value.qpn = u32(field);
    value.gid = gid(field);
    if (ok() && value.qpn > 0xFFFFFF) fail(fmt::format("{}: QP number {:#x} exceeds 24 bits", field, value.qpn));
    return value;
  }
  template <typename Message>
  void pair_keys(Message& value) {
    value.local = key("local QP");
    value.remote = key("remote QP");
  }
  // A PathId byte: 0 (primary) or 1 (standby), nothing else.
  std::uint8_t path(const char* field) {
    const std::uint8_t value = u8(field);
    if (ok() && value > static_cast<std::uint8_t>(PathId::kStandby)) {
      fail(fmt::format("{} {} is not a path (0 primary, 1 standby)", field, value));
    }
    return value;
  }
  // A boolean byte: 0 or 1, nothing else.
  bool flag(const char* field) {
    const std::uint8_t value = u8(field);
    if (ok() && value > 1) fail(fmt::format("{} {} is not a boolean (0 or 1)", field, value));
    return value == 1;
  }
  std::uint32_t psn(const char* field) {
    const std::uint32_t value = u32(field);
    if (ok() && value > 0xFFFFFF) fail(fmt::format("{} {:#x} exceeds 24 bits", field, value));
    return value;
  }
  std::uint32_t qpn(const char* field) {
    const std::uint32_t value = u32(field);
    if (ok() && value > 0xFFFFFF) fail(fmt::format("{} {:#x} exceeds 24 bits", field, value));
    return value;
  }
  Hello hello() {
    Hello value;
    value.process_token = u64("process token");
    value.pid = u32("pid");
    value.port = u16("port");
    const std::uint32_t count = u32("address count");
    if (!ok()) return value;
    if (count > kMaxAddresses || std::size_t{count} * 4 > remaining()) {
      fail(fmt::format("address count {} does not fit the message ({} bytes left, at most {} "
                       "addresses)",
                       count, remaining(), kMaxAddresses));
      return value;
    }
    value.addresses.resize(count);
    for (std::uint32_t& address : value.addresses) address = u32("address");
    return value;
  }
  std::vector<MrTranslation> registrations() {
    std::vector<MrTranslation> list;
    const std::uint32_t count = u32("registration count");
    if (!ok()) return list;
    if (count > kMaxRegistrationsPerMessage || count * kRegistrationSize > remaining()) {
      fail(fmt::format("registration count {} does not fit the message ({} bytes left, at most {} "
                       "entries)",
                       count, remaining(), kMaxRegistrationsPerMessage));
      return list;
    }
    list.resize(count);
    for (MrTranslation& entry : list) {
      entry.address = u64("registration address");
      entry.length = u64("registration length");
      entry.primary_rkey = u32("registration rkey");
      entry.standby_rkey = u32("registration standby rkey");
    }
    return list;
  }
  PairRequest pair() {
    PairRequest value;
    value.local = key("local QP");
    value.remote = key("remote QP");
    value.standby_qpn = u32("standby QP number");
    value.standby_gid = gid("standby GID");
    value.standby_psn = u32("standby PSN");
    value.path_mtu = u8("path MTU");
    value.ece_vendor_id = u32("ECE vendor id");
    value.ece_options = u32("ECE options");
    if (ok() && (value.standby_psn > 0xFFFFFF)) {
      fail(fmt::format("standby PSN {:#x} exceeds 24 bits", value.standby_psn));
    }
    if (ok() && (value.path_mtu < 1 || value.path_mtu > 5)) {
      fail(fmt::format("path MTU {} is not an ibv_mtu (1-5)", value.path_mtu));
    }
    if (ok() && value.ece_vendor_id == 0 && value.ece_options != 0) {
      fail(fmt::format("ECE options {:#x} without a vendor id", value.ece_options));
    }
    value.registrations = registrations();
    return value;
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::size_t remaining() const { return bytes_.size() - offset_; }
  void fail(std::string error) {
    if (error_.empty()) error_ = std::move(error);
  }

 private:
  bool take(std::size_t width, const char* field) {
    if (!ok()) return false;
    if (remaining() < width) {
      fail(fmt::format("message ends inside {}", field));
      return false;
    }
    offset_ += width;
    return true;
  }

  std::span<const std::uint8_t> bytes_;
  std::size_t offset_ = 0;
  std::string error_;
};

MessageType type_of(const ControlMessage& message) {
  return std::visit(
      [](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, PairRequest>) return MessageType::kPairRequest;
        if constexpr (std::is_same_v<T, PairReply>) return MessageType::kPairReply;
        if constexpr (std::is_same_v<T, MrUpdate>) return MessageType::kMrUpdate;
        if constexpr (std::is_same_v<T, FailoverRequest>) return MessageType::kFailoverRequest;
        if constexpr (std::is_same_v<T, FailoverReply>) return MessageType::kFailoverReply;
        if constexpr (std::is_same_v<T, Hello>) return MessageType::kHello;
        if constexpr (std::is_same_v<T, PairRefused>) return MessageType::kPairRefused;
        if constexpr (std::is_same_v<T, Rearm>) return MessageType::kRearm;
        if constexpr (std::is_same_v<T, MrQuery>) return MessageType::kMrQuery;
        if constexpr (std::is_same_v<T, PathStatus>) return MessageType::kPathStatus;
        if constexpr (std::is_same_v<T, PairEnded>) return MessageType::kPairEnded;
        if constexpr (std::is_same_v<T, CmDisconnect>) return MessageType::kCmDisconnect;
      },
      message);
}

std::optional<ControlMessage> read_payload(MessageType type, Reader& reader) {
  switch (type) {
    case MessageType::kPairRequest:
      return ControlMessage{reader.pair()};
    case MessageType::kPairReply:
      return ControlMessage{PairReply{reader.pair()}};
    case MessageType::kMrUpdate:
    {
      MrUpdate value;
      value.registrations = reader.registrations();
      value.device_gid = reader.gid("device GID");
      return ControlMessage{value};
    }
    case MessageType::kFailoverRequest: {
      FailoverRequest value;
      reader.pair_keys(value);
      value.delivered_messages = reader.u64("delivered count");
      value.reason = reader.u32("reason");
      if (reader.ok() && (value.reason < static_cast<std::uint32_t>(FailoverReason::kPortDown) ||
                          value.reason > static_cast<std::uint32_t>(FailoverReason::kFailback))) {
        reader.fail(fmt::format("failover reason {} is unknown", value.reason));
      }
      value.epoch = reader.u32("epoch");
      value.target_path = reader.path("target path");
      return ControlMessage{value};
    }
    case MessageType::kFailoverReply: {
      FailoverReply value;
      reader.pair_keys(value);
      value.delivered_messages = reader.u64("delivered count");
      value.epoch = reader.u32("epoch");
      value.target_path = reader.path("target path");
      return ControlMessage{value};
    }
    case MessageType::kHello:
      return ControlMessage{reader.hello()};
    case MessageType::kPairRefused: {
      PairRefused value;
      reader.pair_keys(value);
      value.reason = reader.u32("refusal reason");
      if (reader.ok() && (value.reason < static_cast<std::uint32_t>(PairRefusal::kUnknownQp) ||
                          value.reason > static_cast<std::uint32_t>(PairRefusal::kUnprotected))) {
        reader.fail(fmt::format("refusal reason {} is unknown", value.reason));
      }
      return ControlMessage{value};
    }
    case MessageType::kRearm: {
      Rearm value;
      reader.pair_keys(value);
      value.path = reader.path("path");
      value.qpn = reader.qpn("rearm QP number");
      value.gid = reader.gid("rearm GID");
      value.psn = reader.psn("rearm PSN");
      value.is_reply = reader.flag("reply flag");
      value.nonce = reader.u32("rearm nonce");
      return ControlMessage{value};
    }
    case MessageType::kMrQuery:
    {
      MrQuery value;
      value.primary_rkey = reader.u32("queried rkey");
      value.device_gid = reader.gid("device GID");
      return ControlMessage{value};
    }
    case MessageType::kPathStatus: {
      PathStatus value;
      reader.pair_keys(value);
      value.path = reader.path("path");
      value.up = reader.flag("up flag");
      value.rearm_nonce = reader.u32("rearm nonce");
      return ControlMessage{value};
    }
    case MessageType::kPairEnded: {
      PairEnded value;
      reader.pair_keys(value);
      return ControlMessage{value};
    }
    case MessageType::kCmDisconnect: {
      CmDisconnect value;
      reader.pair_keys(value);
      value.is_reply = reader.flag("reply flag");
      return ControlMessage{value};
    }
  }
  return std::nullopt;
}

}  // namespace

void encode_control_message(const ControlMessage& message, std::vector<std::uint8_t>& out) {
  const std::size_t start = out.size();
  Writer writer(out);
  writer.u32(kControlMagic);
  writer.u16(kControlVersion);
  writer.u16(static_cast<std::uint16_t>(type_of(message)));
  writer.u32(0);  // length, patched below
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, PairRequest>) {
          writer.pair(value);
        } else if constexpr (std::is_same_v<T, PairReply>) {
          writer.pair(value.pair);
        } else if constexpr (std::is_same_v<T, MrUpdate>) {
          writer.registrations(value.registrations);
          writer.gid(value.device_gid);
        } else if constexpr (std::is_same_v<T, FailoverRequest>) {
          writer.pair_keys(value);
          writer.u64(value.delivered_messages);
          writer.u32(value.reason);
          writer.u32(value.epoch);
          writer.u8(value.target_path);
        } else if constexpr (std::is_same_v<T, FailoverReply>) {
          writer.pair_keys(value);
          writer.u64(value.delivered_messages);
          writer.u32(value.epoch);
          writer.u8(value.target_path);
        } else if constexpr (std::is_same_v<T, Hello>) {
          writer.hello(value);
        } else if constexpr (std::is_same_v<T, PairRefused>) {
          writer.pair_keys(value);
          writer.u32(value.reason);
        } else if constexpr (std::is_same_v<T, Rearm>) {
          writer.pair_keys(value);
          writer.u8(value.path);
          writer.u32(value.qpn);
          writer.gid(value.gid);
          writer.u32(value.psn);
          writer.u8(value.is_reply ? 1 : 0);
          writer.u32(value.nonce);
        } else if constexpr (std::is_same_v<T, MrQuery>) {
          writer.u32(value.primary_rkey);
          writer.gid(value.device_gid);
        } else if constexpr (std::is_same_v<T, PairEnded>) {
          writer.pair_keys(value);
        } else if constexpr (std::is_same_v<T, CmDisconnect>) {
          writer.pair_keys(value);
          writer.u8(value.is_reply ? 1 : 0);
        } else {
          static_assert(std::is_same_v<T, PathStatus>);
          writer.pair_keys(value);
          writer.u8(value.path);
          writer.u8(value.up ? 1 : 0);
          writer.u32(value.rearm_nonce);
        }
      },
      message);
  const auto length = static_cast<std::uint32_t>(out.size() - start - kControlHeaderSize);
  for (int i = 0; i < 4; ++i) out[start + 8 + i] = static_cast<std::uint8_t>(length >> (8 * i));
}

DecodeResult decode_control_message(std::span<const std::uint8_t> bytes) {
  DecodeResult result;
  if (bytes.size() < kControlHeaderSize) {
    result.status = DecodeResult::Status::kNeedMoreBytes;
    return result;
  }
  Reader header(bytes.first(kControlHeaderSize));
  const std::uint32_t magic = header.u32("magic");
  const auto version = static_cast<std::uint16_t>(header.little_endian(2, "version"));
  const auto type = static_cast<std::uint16_t>(header.little_endian(2, "type"));
  const std::uint32_t length = header.u32("length");
  if (magic != kControlMagic) {
    result.error = fmt::format("bad magic {:#010x} (expected {:#010x}): not a verbs-failover peer",
                               magic, kControlMagic);
    return result;
  }
  if (version != kControlVersion) {
    result.error = fmt::format("protocol version {} is not supported (this shim speaks {})",
                               version, kControlVersion);
    return result;
  }
  if (length > kMaxControlPayload) {
    result.error = fmt::format("payload of {} bytes exceeds the limit of {}", length,
                               kMaxControlPayload);
    return result;
  }
  if (bytes.size() < kControlHeaderSize + length) {
    result.status = DecodeResult::Status::kNeedMoreBytes;
    return result;
  }
  Reader reader(bytes.subspan(kControlHeaderSize, length));
  std::optional<ControlMessage> message = read_payload(static_cast<MessageType>(type), reader);
  if (!message) {
    result.error = fmt::format("message type {} is unknown", type);
    return result;
  }
  if (reader.ok() && reader.remaining() != 0) {
    reader.fail(fmt::format("{} unexpected bytes after the message", reader.remaining()));
  }
  if (!reader.ok()) {
    result.error = fmt::format("malformed message of type {}: {}", type, reader.error());
    return result;
  }
  result.status = DecodeResult::Status::kMessage;
  result.message = std::move(*message);
  result.consumed = kControlHeaderSize + length;
  return result;
}

}  // namespace vf
