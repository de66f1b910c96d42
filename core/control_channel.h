// The TCP side of the control channel between shims (docs/design.md §5): a listener on the first
// free port of the configured range, outgoing connections with a bounded connect time, framed
// messages (control_message.h) in both directions. Single-threaded: only the engine's thread
// calls it, from its poll loop. No daemon: every process listens on its own port.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/control_message.h"

namespace vf {

struct ControlSession {
  std::uint64_t id = 0;
  int fd = -1;
  std::uint32_t remote_address = 0;  // IPv4, network order
  std::uint16_t remote_port = 0;
  bool outgoing = false;
  bool hello_received = false;
  Hello peer;  // valid once hello_received
  std::vector<std::uint8_t> input;
};

class ControlChannel {
 public:
  using MessageHandler = std::function<void(ControlSession&, ControlMessage&)>;
  using CloseHandler = std::function<void(const ControlSession&)>;

  ~ControlChannel();
  // Binds the first free port of [first, last] on every address. error says why not.
  bool listen(std::uint16_t first, std::uint16_t last, std::string& error);
  std::uint16_t port() const { return port_; }
  // What this side says first on every connection (its addresses and port).
  void set_hello(const Hello& hello) { hello_ = hello; }

  // Connects within timeout_ms and sends the hello. Returns the session id, 0 on failure.
  std::uint64_t connect(std::uint32_t address, std::uint16_t port, int timeout_ms,
                        std::string& error);
  bool send(std::uint64_t session, const ControlMessage& message);
  void close(std::uint64_t session);
  ControlSession* find(std::uint64_t session);
  // A live session (outgoing or incoming) with the process that said hello with this token.
  ControlSession* find_by_token(std::uint64_t token);
  ControlSession* find_by_endpoint(std::uint32_t address, std::uint16_t port);

  // Poll-loop integration: fds to watch, then the revents of those same fds.
  void collect(std::vector<pollfd>& fds) const;
  void handle(const std::vector<pollfd>& fds, std::size_t first, const MessageHandler& on_message,
              const CloseHandler& on_close);
  // Forgets everything without closing (a forked child: the fds are the parent's).
  void abandon();

 private:
  std::uint64_t adopt(int fd, std::uint32_t address, std::uint16_t port, bool outgoing);
  void read_from(ControlSession& session, const MessageHandler& on_message,
                 const CloseHandler& on_close);

  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  Hello hello_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, ControlSession> sessions_;
};

// The host's IPv4 addresses (network order), non-loopback, with those not in `rail_addresses`
// first: the management network outlives a failed rail.
std::vector<std::uint32_t> local_ipv4_addresses(const std::vector<std::uint32_t>& rail_addresses);

// The IPv4 address inside a RoCEv2 GID (::ffff:a.b.c.d), or 0.
std::uint32_t ipv4_of_gid(const Gid& gid);
std::string ipv4_text(std::uint32_t address);

}  // namespace vf
