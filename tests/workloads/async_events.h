// One thread per device context reading ibv_get_async_event, with NCCL's policy: QP_FATAL,
// QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR and DEVICE_FATAL end the process at once (a clear message,
// non-zero exit); PORT_ERR, PORT_ACTIVE, GID_CHANGE and the rest are only logged.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <string>
#include <thread>

namespace nccl_pattern {

class AsyncEventThread {
 public:
  AsyncEventThread(ibv_context* context, std::string device, int rank);
  ~AsyncEventThread();  // stops and joins
  AsyncEventThread(const AsyncEventThread&) = delete;
  AsyncEventThread& operator=(const AsyncEventThread&) = delete;

 private:
  void run();

  ibv_context* context_;
  std::string device_;
  int rank_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace nccl_pattern
