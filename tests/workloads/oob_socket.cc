#include "oob_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "failure.h"

namespace nccl_pattern {
namespace {

// Waits for EVENTS on fd in short slices so that the abort flag is noticed.
void wait_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    throw_if_aborted();
    if (Clock::now() >= deadline) fail(std::string("timeout waiting for bootstrap: ") + what);
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, 100);
    if (n > 0) return;
    if (n < 0 && errno != EINTR) fail(std::string("poll failed during ") + what + ": " + std::strerror(errno));
  }
}

}  // namespace

OobLink& OobLink::operator=(OobLink&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

OobLink::~OobLink() {
  if (fd_ >= 0) ::close(fd_);
}

void OobLink::send_all(const void* data, size_t size, Clock::time_point deadline, const char* what) const {
  auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    wait_fd(fd_, POLLOUT, deadline, what);
    const ssize_t n = ::send(fd_, bytes, size, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) fail(std::string("bootstrap send failed (") + what + "): " + std::strerror(errno));
    bytes += n;
    size -= static_cast<size_t>(n);
  }
}

void OobLink::recv_all(void* data, size_t size, Clock::time_point deadline, const char* what) const {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    wait_fd(fd_, POLLIN, deadline, what);
    const ssize_t n = ::recv(fd_, bytes, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) fail(std::string("bootstrap peer closed the link (") + what + ")");
    if (n < 0) fail(std::string("bootstrap recv failed (") + what + "): " + std::strerror(errno));
    bytes += n;
    size -= static_cast<size_t>(n);
  }
}

int listen_on(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    fail("cannot listen on port " + std::to_string(port) + ": " + err);
  }
  return fd;
}

OobLink accept_one(int listen_fd, Clock::time_point deadline) {
  wait_fd(listen_fd, POLLIN, deadline, "accept from the previous rank");
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) fail(std::string("accept: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return OobLink(fd);
}

OobLink connect_to(const std::string& host_port, Clock::time_point deadline) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) fail("--next must be HOST:PORT, got " + host_port);
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    fail("cannot resolve " + host_port + ": " + gai_strerror(rc));
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return OobLink(fd);
    }
    const int err = errno;
    ::close(fd);
    // The next rank may not listen yet (ranks start in any order): retry until the deadline.
    if (Clock::now() >= deadline || g_abort_all.load()) {
      ::freeaddrinfo(found);
      throw_if_aborted();
      fail("cannot connect to the next rank at " + host_port + ": " + std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace nccl_pattern
