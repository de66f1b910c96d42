#include "core/control_channel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"

namespace vf {
namespace {

void set_nonblocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A peer that vanished (its host died) is noticed within seconds, not hours.
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  const int idle = 2, interval = 1, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  const unsigned int user_timeout_ms = 3000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

std::uint64_t monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

bool write_all(int fd, const std::uint8_t* data, std::size_t length) {
  while (length > 0) {
    const ssize_t written = ::send(fd, data, length, MSG_NOSIGNAL);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, 1000) <= 0) return false;
        continue;
      }
      return false;
    }
    data += written;
    length -= static_cast<std::size_t>(written);
  }
  return true;
}

}  // namespace

ControlChannel::~ControlChannel() {
  for (auto& [id, session] : sessions_) ::close(session.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool ControlChannel::listen(std::uint16_t first, std::uint16_t last, std::string& error) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error = fmt::format("socket: {}", strerror(errno));
    return false;
  }
  // A process that ended (a job restarted on this host) leaves its accepted sessions in
  // TIME_WAIT on its port for a minute; without SO_REUSEADDR that port could not be listened on
  // again until then. Two live listeners still never share a port (Linux refuses the bind).
  const int reuse = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
  for (std::uint32_t port = first; port <= last; ++port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        ::listen(fd, 64) == 0) {
      listen_fd_ = fd;
      port_ = static_cast<std::uint16_t>(port);
      return true;
    }
  }
  error = fmt::format("no free TCP port in {}-{} (VERBS_FAILOVER_CTRL_ADDRS)", first, last);
  ::close(fd);
  return false;
}

std::uint64_t ControlChannel::adopt(int fd, std::uint32_t address, std::uint16_t port,
                                    bool outgoing, std::uint64_t connect_deadline_ns) {
  tune(fd);
  set_nonblocking(fd, true);
  ControlSession session;
  session.id = next_id_++;
  session.fd = fd;
  session.remote_address = address;
  session.remote_port = port;
  session.outgoing = outgoing;
  session.connecting = connect_deadline_ns != 0;  // the hello waits in its output until it is up
  session.connect_deadline_ns = connect_deadline_ns;
  const std::uint64_t id = session.id;
  sessions_.emplace(id, std::move(session));
  if (!send(id, hello_)) return 0;
  return id;
}

namespace {

// A non-blocking socket whose connect to address:port has started: the fd and connect()'s result
// (errno kept), or -1 with error set when no socket could be made.
int start_connect(std::uint32_t address, std::uint16_t port, int* result, std::string& error) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error = fmt::format("socket: {}", strerror(errno));
    return -1;
  }
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_addr.s_addr = address;
  target.sin_port = htons(port);
  *result = ::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof target);
  return fd;
}

}  // namespace

std::uint64_t ControlChannel::connect(std::uint32_t address, std::uint16_t port, int timeout_ms,
                                      std::string& error) {
  int result = 0;
  const int fd = start_connect(address, port, &result, error);
  if (fd < 0) return 0;
  if (result != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    result = ::poll(&pfd, 1, timeout_ms);
    if (result == 0) {
      error = "timed out";
      ::close(fd);
      return 0;
    }
    int so_error = 0;
    socklen_t length = sizeof so_error;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error != 0) {
      error = strerror(so_error);
      ::close(fd);
      return 0;
    }
  } else if (result != 0) {
    error = strerror(errno);
    ::close(fd);
    return 0;
  }
  const std::uint64_t id = adopt(fd, address, port, true);
  if (id == 0) error = "could not send hello";
  return id;
}

std::uint64_t ControlChannel::connect_async(std::uint32_t address, std::uint16_t port,
                                            int timeout_ms, std::string& error) {
  int result = 0;
  const int fd = start_connect(address, port, &result, error);
  if (fd < 0) return 0;
  if (result == 0) {
    const std::uint64_t id = adopt(fd, address, port, true);
    if (id == 0) error = "could not send hello";
    return id;
  }
  if (errno != EINPROGRESS) {
    error = strerror(errno);
    ::close(fd);
    return 0;
  }
  return adopt(fd, address, port, true,
               monotonic_now_ns() + static_cast<std::uint64_t>(timeout_ms) * 1'000'000ull);
}

void ControlChannel::close_and_report(std::uint64_t id, const CloseHandler& on_close) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  const ControlSession copy = it->second;
  ::close(it->second.fd);
  sessions_.erase(it);
  on_close(copy);
}

void ControlChannel::finish_connect(ControlSession& session, const CloseHandler& on_close) {
  // The poll result may be another socket's that had this fd number (closed and reused within
  // one round of handle()): only a socket that is writable or failed right now is done.
  pollfd pfd{session.fd, POLLOUT, 0};
  if (::poll(&pfd, 1, 0) <= 0) return;
  int so_error = 0;
  socklen_t length = sizeof so_error;
  if (getsockopt(session.fd, SOL_SOCKET, SO_ERROR, &so_error, &length) != 0) so_error = errno;
  if (so_error == 0) {
    session.connecting = false;
    if (write_all(session.fd, session.output.data(), session.output.size())) {
      session.output.clear();
      session.output.shrink_to_fit();
      return;
    }
    so_error = errno;
  }
  VF_LOG_DEBUG("control: connecting to {}:{} failed ({})", ipv4_text(session.remote_address),
               session.remote_port, strerror(so_error));
  close_and_report(session.id, on_close);
}

bool ControlChannel::send(std::uint64_t id, const ControlMessage& message) {
  ControlSession* session = find(id);
  if (session == nullptr) return false;
  if (unsigned& lose = lose_next_[message.index()]; lose > 0) {
    // Lost as a message is when its session dies after the send: taken, never delivered, and
    // both ends learn of the session's end the usual way (poll sees it closed).
    --lose;
    VF_LOG_INFO("control: a {} to {}:{} lost on the way, its session cut (a test's fault injection)",
                kControlMessageNames[message.index()], ipv4_text(session->remote_address),
                session->remote_port);
    ::shutdown(session->fd, SHUT_RDWR);
    return true;
  }
  if (session->connecting) {
    encode_control_message(message, session->output);
    return true;
  }
  std::vector<std::uint8_t> bytes;
  encode_control_message(message, bytes);
  if (!write_all(session->fd, bytes.data(), bytes.size())) {
    VF_LOG_DEBUG("control: send to {}:{} failed; closing the session",
                 ipv4_text(session->remote_address), session->remote_port);
    close(id);
    return false;
  }
  return true;
}

void ControlChannel::close(std::uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  ::close(it->second.fd);
  sessions_.erase(it);
}

ControlSession* ControlChannel::find(std::uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

ControlSession* ControlChannel::find_by_token(std::uint64_t token) {
  // The session on the peer's first advertised address (its management network), else the
  // newest (opened last, most likely on a working address). Never merely the newest: the first
  // contact goes to an address from the QP's GID, a rail, and the peer's own first contact comes
  // from one; a switch's request sent on a session over the rail that just died waits in TCP's
  // queue until the peer's answer times out (seen in the lab under load).
  ControlSession* newest = nullptr;
  for (auto& [id, session] : sessions_) {
    if (!session.hello_received || session.peer.process_token != token) continue;
    if (!session.peer.addresses.empty() && session.remote_address == session.peer.addresses.front()) {
      return &session;
    }
    newest = &session;
  }
  return newest;
}

ControlSession* ControlChannel::find_by_endpoint(std::uint32_t address, std::uint16_t port) {
  for (auto& [id, session] : sessions_) {
    if (session.outgoing && session.remote_address == address && session.remote_port == port) {
      return &session;
    }
  }
  return nullptr;
}

void ControlChannel::collect(std::vector<pollfd>& fds) const {
  if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});
  for (const auto& [id, session] : sessions_) {
    fds.push_back({session.fd, static_cast<short>(session.connecting ? POLLOUT : POLLIN), 0});
  }
}

void ControlChannel::handle(const std::vector<pollfd>& fds, std::size_t first,
                            const MessageHandler& on_message, const CloseHandler& on_close) {
  std::size_t index = first;
  std::vector<int> readable;
  if (listen_fd_ >= 0) {
    if (fds[index].revents & POLLIN) {
      for (;;) {
        sockaddr_in from{};
        socklen_t length = sizeof from;
        const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &length,
                                 SOCK_CLOEXEC);
        if (fd < 0) break;
        adopt(fd, from.sin_addr.s_addr, ntohs(from.sin_port), false);
      }
    }
    ++index;
  }
  for (; index < fds.size(); ++index) {
    if (fds[index].revents != 0) readable.push_back(fds[index].fd);
  }
  for (int fd : readable) {
    for (auto& [id, session] : sessions_) {
      if (session.fd == fd) {
        if (session.connecting) {
          finish_connect(session, on_close);
        } else {
          read_from(session, on_message, on_close);
        }
        break;
      }
    }
  }
  // Connections that did not come up in time (a host that drops the SYN answers nothing).
  const std::uint64_t now = monotonic_now_ns();
  std::vector<std::uint64_t> expired;
  for (const auto& [id, session] : sessions_) {
    if (session.connecting && now >= session.connect_deadline_ns) expired.push_back(id);
  }
  for (std::uint64_t id : expired) {
    if (ControlSession* session = find(id)) {
      VF_LOG_DEBUG("control: connecting to {}:{} timed out", ipv4_text(session->remote_address),
                   session->remote_port);
    }
    close_and_report(id, on_close);
  }
}

void ControlChannel::read_from(ControlSession& session, const MessageHandler& on_message,
                               const CloseHandler& on_close) {
  std::uint8_t buffer[16384];
  const std::uint64_t id = session.id;
  for (;;) {
    const ssize_t got = ::recv(session.fd, buffer, sizeof buffer, 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      const ControlSession copy = session;
      ::close(session.fd);
      sessions_.erase(id);
      on_close(copy);
      return;
    }
    if (got < 0) break;
    session.input.insert(session.input.end(), buffer, buffer + got);
  }
  std::size_t offset = 0;
  while (offset < session.input.size()) {
    DecodeResult decoded = decode_control_message(
        std::span<const std::uint8_t>(session.input).subspan(offset));
    if (decoded.status == DecodeResult::Status::kNeedMoreBytes) break;
    if (decoded.status == DecodeResult::Status::kError) {
      VF_LOG_WARN("control: malformed message from {}:{} ({}); closing that session",
                  ipv4_text(session.remote_address), session.remote_port, decoded.error);
      const ControlSession copy = session;
      ::close(session.fd);
      sessions_.erase(id);
      on_close(copy);
      return;
    }
    offset += decoded.consumed;
    if (auto* hello = std::get_if<Hello>(&decoded.message)) {
      session.peer = *hello;
      session.hello_received = true;
    }
    on_message(session, decoded.message);
    if (find(id) == nullptr) return;  // the handler closed it
  }
  session.input.erase(session.input.begin(),
                      session.input.begin() + static_cast<std::ptrdiff_t>(offset));
}

void ControlChannel::abandon() {
  sessions_.clear();
  listen_fd_ = -1;
  port_ = 0;
}

std::vector<std::uint32_t> local_ipv4_addresses(const std::vector<std::uint32_t>& rails) {
  std::vector<std::uint32_t> management, rail;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const std::uint32_t address =
        reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr;
    if ((ntohl(address) >> 24) == 127) continue;
    auto& target = std::find(rails.begin(), rails.end(), address) != rails.end() ? rail : management;
    if (std::find(target.begin(), target.end(), address) == target.end()) target.push_back(address);
  }
  freeifaddrs(list);
  management.insert(management.end(), rail.begin(), rail.end());
  return management;
}

std::uint32_t ipv4_of_gid(const Gid& gid) {
  static constexpr std::uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid.data(), kPrefix, sizeof kPrefix) != 0) return 0;
  std::uint32_t address = 0;
  std::memcpy(&address, gid.data() + 12, 4);
  return address;
}

std::string ipv4_text(std::uint32_t address) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr in{};
  in.s_addr = address;
  inet_ntop(AF_INET, &in, text, sizeof text);
  return text;
}

}  // namespace vf
