#include "async_events.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>

#include "verbs_api.h"

namespace nccl_pattern {
namespace {

bool is_fatal(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      return true;
    default:
      return false;
  }
}

}  // namespace

AsyncEventThread::AsyncEventThread(ibv_context* context, std::string device, int rank)
    : context_(context), device_(std::move(device)), rank_(rank), thread_([this] { run(); }) {}

AsyncEventThread::~AsyncEventThread() {
  stop_ = true;
  thread_.join();
}

void AsyncEventThread::run() {
  const VerbsApi& api = verbs();
  // NCCL's async thread blocks in ibv_get_async_event and is never joined; this one must stop,
  // so it polls with a timeout and reads with a non-blocking fd (as UCX does): an event that is
  // consumed by someone else between poll() and the read (a failover shim hides the events of
  // protected ports) then reads as EAGAIN instead of blocking the thread forever.
  const int flags = ::fcntl(context_->async_fd, F_GETFL);
  ::fcntl(context_->async_fd, F_SETFL, flags | O_NONBLOCK);
  while (!stop_.load()) {
    pollfd p{context_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ibv_async_event event{};
    if (api.get_async_event(context_, &event) != 0) continue;
    const ibv_event_type type = event.event_type;
    const char* name = api.event_type_str(type);
    if (is_fatal(type)) {
      std::printf("nccl_pattern: rank %d FAIL fatal async event %s (%d) on %s\n", rank_, name,
                  static_cast<int>(type), device_.c_str());
      std::fprintf(stderr, "nccl_pattern: rank %d NET/IB-like : fatal async event %s on %s, aborting\n",
                   rank_, name, device_.c_str());
      std::fflush(nullptr);
      ::_exit(3);  // like NCCL: the communicator cannot go on; no clean-up of a broken device
    }
    std::printf("nccl_pattern: rank %d async event %s (%d) on %s (logged only)\n", rank_, name,
                static_cast<int>(type), device_.c_str());
    std::fflush(stdout);
    api.ack_async_event(&event);
  }
}

}  // namespace nccl_pattern
