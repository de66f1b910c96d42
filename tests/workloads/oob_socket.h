// Out-of-band bootstrap links (TCP on the management network, or socketpairs in single-process
// mode): the application-level channel over which QP numbers, GIDs and the clear-to-send fifo's
// address/rkey travel before any RDMA, as an application's own bootstrap would carry them.
// Every call has a deadline and also gives up when another local rank failed.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace nccl_pattern {

using Clock = std::chrono::steady_clock;

class OobLink {
 public:
  OobLink() = default;
  explicit OobLink(int fd) : fd_(fd) {}
  OobLink(OobLink&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OobLink& operator=(OobLink&& other) noexcept;
  ~OobLink();

  void send_all(const void* data, size_t size, Clock::time_point deadline, const char* what) const;
  void recv_all(void* data, size_t size, Clock::time_point deadline, const char* what) const;

 private:
  int fd_ = -1;
};

// Listens on PORT (all addresses) before connecting anywhere, so that a ring of processes started
// in any order can form.
int listen_on(int port);
OobLink accept_one(int listen_fd, Clock::time_point deadline);
// Retries until the peer listens or the deadline passes. host_port is "HOST:PORT".
OobLink connect_to(const std::string& host_port, Clock::time_point deadline);

}  // namespace nccl_pattern
