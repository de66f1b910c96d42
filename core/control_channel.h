// The TCP side of the control channel between shims (docs/design.md §5): a listener on the first
// free port of the configured range, outgoing connections (waited for with a bound, or not
// waited for at all: connect_async), framed messages (control_message.h) in both directions.
// Single-threaded: only the engine's thread calls it, from its poll loop. No daemon: every
// process listens on its own port.
#pragma once

#include <poll.h>

#include <array>
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
  // connect_async: the TCP connection is not up yet; what is sent meanwhile (the hello first)
  // waits in `output`, and a connection not up by the deadline is closed.
  bool connecting = false;
  std::uint64_t connect_deadline_ns = 0;
  std::vector<std::uint8_t> output;
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
  const Hello& hello() const { return hello_; }

  // Connects within timeout_ms and sends the hello. Returns the session id, 0 on failure.
  std::uint64_t connect(std::uint32_t address, std::uint16_t port, int timeout_ms,
                        std::string& error);
  // Starts a connection and returns at once: the session exists (messages sent to it are queued
  // until it is up, the hello first), and if it is not up within timeout_ms, or the peer refuses
  // it, it is closed through handle()'s close handler. 0 (error says why) when it fails at once.
  // The engine's thread must never wait for a peer that does not answer: it also detects
  // failures and switches paths.
  std::uint64_t connect_async(std::uint32_t address, std::uint16_t port, int timeout_ms,
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
  // Fault injection for tests (verbs_failover_debug_lose_control): the next `count` messages of
  // this kind (an index of ControlMessage) that send() is given are lost on the way, and their
  // session cut, as a reply is lost when its session dies after the request was handled.
  void lose_next(std::size_t kind, unsigned count) { lose_next_.at(kind) = count; }
  unsigned still_to_lose(std::size_t kind) const { return lose_next_.at(kind); }

 private:
  // A session on a connected socket (or, with a deadline, one still connecting).
  std::uint64_t adopt(int fd, std::uint32_t address, std::uint16_t port, bool outgoing,
                      std::uint64_t connect_deadline_ns = 0);
  void read_from(ControlSession& session, const MessageHandler& on_message,
                 const CloseHandler& on_close);
  // A connecting session became writable (or failed): up and flushed, or closed.
  void finish_connect(ControlSession& session, const CloseHandler& on_close);
  void close_and_report(std::uint64_t id, const CloseHandler& on_close);

  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  Hello hello_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, ControlSession> sessions_;
  std::array<unsigned, std::variant_size_v<ControlMessage>> lose_next_{};
};

// The host's IPv4 addresses (network order), non-loopback, with those not in `rail_addresses`
// first: the management network outlives a failed rail.
std::vector<std::uint32_t> local_ipv4_addresses(const std::vector<std::uint32_t>& rail_addresses);

// The IPv4 address inside a RoCEv2 GID (::ffff:a.b.c.d), or 0.
std::uint32_t ipv4_of_gid(const Gid& gid);
std::string ipv4_text(std::uint32_t address);

}  // namespace vf
