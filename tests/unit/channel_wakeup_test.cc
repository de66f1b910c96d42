// core/failover/channel_wakeup.cc: a thread waiting for a completion event through the shim
// returns when the channel's own event file can only give an error.
#include <catch2/catch.hpp>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>

#include "core/failover/channel_wakeup.h"
#include "core/virtual_qp.h"

namespace {

using vf::failover::Engine;

// A channel the shim knows (its CQs have a shadow) but whose fd it could not replace (made before
// the engine ran): ibv_get_cq_event waits on the real fd and the engine's eventfd itself.
struct UnreplacedChannel {
  std::unique_ptr<Engine> e = std::make_unique<Engine>();
  ibv_comp_channel channel{};
  ibv_comp_channel shadow{};
  int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
  int error = 0;  // errno as the waiting thread left it

  explicit UnreplacedChannel(int real_fd) {
    channel.fd = real_fd;
    auto& state = e->channels[&channel];
    state.app_channel = &channel;
    state.shadow_channel = &shadow;
    state.wake_fd = wake_fd;
  }
  ~UnreplacedChannel() { close(wake_fd); }

  // Runs get_cq_event on another thread; its result, or 1 when it did not return within the
  // bound (the thread is then released: the channel is forgotten and a token wakes it).
  int wait_bounded() {
    auto waiter = std::async(std::launch::async, [this] {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      const int result = vf::failover::get_cq_event(*e, &channel, &cq, &context);
      error = errno;  // the waiter's own (errno is per thread)
      return result;
    });
    if (waiter.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
      return waiter.get();
    }
    {
      std::lock_guard lock(e->mutex);
      e->channels.clear();
    }
    eventfd_write(wake_fd, 1);
    waiter.get();
    return 1;
  }
};

}  // namespace

TEST_CASE("A wait on an unreplaced channel whose event file hung up hands over to the real verb",
          "[engine]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  close(fds[1]);  // the read end now polls POLLHUP, never POLLIN: as a file whose device went
  UnreplacedChannel rig(fds[0]);
  // -2: libibverbs' own ibv_get_cq_event is next and reports the file's error; a wait that
  // looked only for POLLIN spun for ever here.
  CHECK(rig.wait_bounded() == -2);
  close(fds[0]);
}

TEST_CASE("A wait on an unreplaced channel whose event file failed waits for the standby's "
          "events", "[engine]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  close(fds[1]);  // POLLHUP, as the event file of a device that was reset or removed
  REQUIRE(fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0);
  UnreplacedChannel rig(fds[0]);
  // One CQ of the channel carries traffic on the standby: its events are still to come, so the
  // application's non-blocking wait reads EAGAIN (as on an empty file), not the primary's error.
  ibv_context_ops ops{};
  ibv_cq cq{};
  ibv_cq shadow{};
  vf::CqState state(&cq, 0, &ops, 64);
  state.shadow = &shadow;
  rig.e->channels[&rig.channel].cqs.push_back(&state);
  CHECK(rig.wait_bounded() == -1);
  CHECK(rig.error == EAGAIN);
  // An event of the standby is handed out as the application's CQ's.
  REQUIRE(state.shadow_events.add_due());
  eventfd_write(rig.wake_fd, 1);
  CHECK(rig.wait_bounded() == 0);
  CHECK(state.shadow_events.unacked() == 1);
  close(fds[0]);
}
