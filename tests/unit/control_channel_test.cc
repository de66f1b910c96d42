// ControlChannel over real loopback TCP: connect_async returns at once, queues what is sent until
// the connection is up, and reports a connection that fails or never comes up through the close
// handler. Every wait is a bounded loop of poll() rounds; nothing sleeps.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "core/control_channel.h"

namespace {

const std::uint32_t kLoopback = htonl(INADDR_LOOPBACK);

struct Events {
  std::vector<vf::ControlMessage> messages;
  std::vector<std::uint64_t> closed;
};

// One poll round over both channels (up to 50 ms), then both handle what came.
void pump(vf::ControlChannel& a, Events& a_events, vf::ControlChannel& b, Events& b_events) {
  std::vector<pollfd> fds;
  a.collect(fds);
  const std::size_t b_first = fds.size();
  b.collect(fds);
  ::poll(fds.data(), fds.size(), 50);
  std::vector<pollfd> a_fds(fds.begin(), fds.begin() + static_cast<std::ptrdiff_t>(b_first));
  std::vector<pollfd> b_fds(fds.begin() + static_cast<std::ptrdiff_t>(b_first), fds.end());
  a.handle(
      a_fds, 0, [&](vf::ControlSession&, vf::ControlMessage& m) { a_events.messages.push_back(m); },
      [&](const vf::ControlSession& s) { a_events.closed.push_back(s.id); });
  b.handle(
      b_fds, 0, [&](vf::ControlSession&, vf::ControlMessage& m) { b_events.messages.push_back(m); },
      [&](const vf::ControlSession& s) { b_events.closed.push_back(s.id); });
}

// A loopback TCP port with a socket bound to it but not listening: connecting is refused.
struct RefusingPort {
  int fd = -1;
  std::uint16_t port = 0;
  RefusingPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = kLoopback;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
  ~RefusingPort() { ::close(fd); }
};

vf::Hello hello_of(std::uint32_t pid) {
  vf::Hello hello;
  hello.process_token = 0x1000 + pid;
  hello.pid = pid;
  return hello;
}

}  // namespace

TEST_CASE("connect_async: messages sent before the connection is up arrive after the hello, in order") {
  vf::ControlChannel server, client;
  std::string error;
  REQUIRE(server.listen(18690, 18699, error));
  server.set_hello(hello_of(1));
  client.set_hello(hello_of(2));
  const std::uint64_t id = client.connect_async(kLoopback, server.port(), 2000, error);
  REQUIRE(id != 0);
  REQUIRE(client.send(id, vf::MrQuery{0x11, {}}));
  REQUIRE(client.send(id, vf::MrQuery{0x22, {}}));
  Events server_events, client_events;
  for (int round = 0; round < 100 && server_events.messages.size() < 3; ++round) {
    pump(server, server_events, client, client_events);
  }
  REQUIRE(server_events.messages.size() == 3);
  CHECK(std::get<vf::Hello>(server_events.messages[0]).pid == 2);
  CHECK(std::get<vf::MrQuery>(server_events.messages[1]).primary_rkey == 0x11);
  CHECK(std::get<vf::MrQuery>(server_events.messages[2]).primary_rkey == 0x22);
  CHECK(client_events.closed.empty());
  CHECK_FALSE(client.find(id)->connecting);
  // The server's hello came back on the same session.
  for (int round = 0; round < 100 && client_events.messages.empty(); ++round) {
    pump(server, server_events, client, client_events);
  }
  REQUIRE(client_events.messages.size() == 1);
  CHECK(std::get<vf::Hello>(client_events.messages[0]).pid == 1);
}

TEST_CASE("connect_async: a refused connection is reported, at once or through the close handler") {
  vf::ControlChannel server, client;
  std::string error;
  REQUIRE(server.listen(18690, 18699, error));
  RefusingPort refusing;
  const std::uint64_t id = client.connect_async(kLoopback, refusing.port, 2000, error);
  if (id == 0) {
    CHECK_FALSE(error.empty());
    return;
  }
  CHECK(client.send(id, vf::MrQuery{0x33, {}}));  // queued; goes nowhere
  Events server_events, client_events;
  for (int round = 0; round < 100 && client_events.closed.empty(); ++round) {
    pump(server, server_events, client, client_events);
  }
  REQUIRE(client_events.closed.size() == 1);
  CHECK(client_events.closed[0] == id);
  CHECK(client.find(id) == nullptr);
  CHECK(server_events.messages.empty());
}

TEST_CASE("connect_async: a connection that never comes up is closed at its deadline") {
  // A listener whose accept queue is full: Linux drops further SYNs, so those connections hang
  // in SYN_SENT, as with a host behind a firewall that drops the control port.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = kLoopback;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 0) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const std::uint16_t port = ntohs(address.sin_port);

  vf::ControlChannel server, client;
  std::string error;
  REQUIRE(server.listen(18690, 18699, error));
  Events server_events, client_events;
  // Fill the queue: connections that come up (and are never accepted) until one does not.
  std::vector<std::uint64_t> hanging;
  for (int attempt = 0; attempt < 8 && hanging.empty(); ++attempt) {
    const std::uint64_t id = client.connect_async(kLoopback, port, 300, error);
    REQUIRE(id != 0);
    for (int round = 0; round < 4; ++round) pump(server, server_events, client, client_events);
    if (client.find(id) != nullptr && client.find(id)->connecting) hanging.push_back(id);
  }
  REQUIRE_FALSE(hanging.empty());  // Linux drops SYNs to a listener whose accept queue is full
  for (int round = 0; round < 100 && client_events.closed.empty(); ++round) {
    pump(server, server_events, client, client_events);
  }
  ::close(listener);
  REQUIRE_FALSE(client_events.closed.empty());
  CHECK(std::find(client_events.closed.begin(), client_events.closed.end(), hanging[0]) !=
        client_events.closed.end());
  CHECK(client.find(hanging[0]) == nullptr);
}

TEST_CASE("find_by_token: the session on the peer's first advertised address, even when newer ones exist") {
  // The peer advertises 127.0.0.1 first (its "management" address) and is reached on it first,
  // then on 127.0.0.2 (a "rail": the first contact of a QP goes to its GID's address). The newer
  // session must not win: a rail may be the very thing that just died.
  const std::uint32_t management = htonl(0x7f000001);
  const std::uint32_t rail = htonl(0x7f000002);
  vf::ControlChannel server, client;
  std::string error;
  REQUIRE(server.listen(18690, 18699, error));
  vf::Hello server_hello = hello_of(1);
  server_hello.addresses = {management, rail};
  server.set_hello(server_hello);
  client.set_hello(hello_of(2));
  const std::uint64_t first = client.connect_async(management, server.port(), 2000, error);
  REQUIRE(first != 0);
  Events server_events, client_events;
  auto hellos_from_server = [&] {
    return std::count_if(client_events.messages.begin(), client_events.messages.end(),
                         [](const vf::ControlMessage& m) { return std::holds_alternative<vf::Hello>(m); });
  };
  for (int round = 0; round < 100 && hellos_from_server() < 1; ++round) {
    pump(server, server_events, client, client_events);
  }
  REQUIRE(hellos_from_server() == 1);
  const std::uint64_t second = client.connect_async(rail, server.port(), 2000, error);
  REQUIRE(second != 0);
  for (int round = 0; round < 100 && hellos_from_server() < 2; ++round) {
    pump(server, server_events, client, client_events);
  }
  REQUIRE(hellos_from_server() == 2);
  vf::ControlSession* chosen = client.find_by_token(server_hello.process_token);
  REQUIRE(chosen != nullptr);
  CHECK(chosen->id == first);
  CHECK(chosen->remote_address == management);
  // Without it, the newest.
  client.close(first);
  chosen = client.find_by_token(server_hello.process_token);
  REQUIRE(chosen != nullptr);
  CHECK(chosen->id == second);
}

TEST_CASE("listen: a port whose last listener left connections in TIME_WAIT is taken again, a live one is not") {
  // A job restarted on the same host (torchrun's elastic restart) must get its control port back
  // at once: the previous process closed its accepted sessions first, which leaves them in
  // TIME_WAIT on that port for a minute.
  std::uint16_t port = 0;
  vf::ControlChannel client;
  Events client_events;
  {
    vf::ControlChannel server;
    std::string error;
    // A range of its own: the other cases (run in parallel by ctest) cannot take the port
    // between the two listens.
    REQUIRE(server.listen(18780, 18789, error));
    port = server.port();
    server.set_hello(hello_of(1));
    client.set_hello(hello_of(2));
    REQUIRE(client.connect_async(kLoopback, port, 2000, error) != 0);
    Events server_events;
    for (int round = 0; round < 100 && client_events.messages.empty(); ++round) {
      pump(server, server_events, client, client_events);
    }
    REQUIRE(client_events.messages.size() == 1);  // the session is up both ways
  }  // the server ends first: its side of the session goes to TIME_WAIT
  vf::ControlChannel restarted, second;
  std::string error;
  CHECK(restarted.listen(port, port, error));
  INFO(error);
  CHECK(restarted.port() == port);
  // Two live processes never share a port.
  CHECK_FALSE(second.listen(port, port, error));
}
