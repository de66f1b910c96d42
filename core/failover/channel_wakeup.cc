#include "core/failover/channel_wakeup.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "core/failover/devices.h"
#include "core/log.h"

namespace vf::failover {

namespace {

// One event of a shadow CQ (or of the stash) handed to the application as its CQ's, if any.
bool take_shadow_event(const std::vector<CqState*>& cqs, ibv_cq** cq, void** cq_context) {
  for (CqState* state : cqs) {
    if (state->shadow_events.hand_out()) {
      *cq = state->app_cq;
      *cq_context = state->app_cq->cq_context;
      return true;
    }
  }
  return false;
}

// A signal ended a wait of ibv_get_cq_event in poll(), which no handler restarts. Without the shim
// the wait is a read() of the event file: restarted when the handler has SA_RESTART, else -1 with
// EINTR (how Python's Ctrl-C or a program's timer gets a thread out of it). Which signal came is
// not known here: the wait restarts only if every signal this thread can take has no handler or
// one with SA_RESTART, else it ends with EINTR. The fault signals are left out: a crash handler
// (a JVM's, a sanitizer's, VERBS_FAILOVER_BACKTRACE's) is not what wakes a waiting thread.
bool is_fault_signal(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP ||
         sig == SIGSYS || sig == SIGABRT;
}

bool signal_restarts_wait() {
  sigset_t blocked;
  sigemptyset(&blocked);
  pthread_sigmask(SIG_BLOCK, nullptr, &blocked);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction action {};
    if (is_fault_signal(sig) || sigismember(&blocked, sig) == 1 ||
        sigaction(sig, nullptr, &action) != 0) {
      continue;
    }
    const bool handled = (action.sa_flags & SA_SIGINFO) ? action.sa_sigaction != nullptr
                                                        : (action.sa_handler != SIG_DFL &&
                                                           action.sa_handler != SIG_IGN);
    if (handled && !(action.sa_flags & SA_RESTART)) return false;
  }
  return true;
}

// poll() for ibv_get_cq_event's wait: < 0 with errno EINTR only when the wait must end (above).
int poll_for_event(pollfd* fds, nfds_t count, int timeout_ms) {
  for (;;) {
    const int ready = ::poll(fds, count, timeout_ms);
    if (ready >= 0 || errno != EINTR || !signal_restarts_wait()) return ready;
  }
}

void close_if_open(int fd) {
  if (fd >= 0) close(fd);
}

// A channel whose fd could not be replaced (made before the engine ran, or no epoll set): the
// waiting thread watches both the real fd and the engine's eventfd itself. -2: the real verb is
// next; -3: a token came, look at the channel again (its CQs may have changed); -4: the real
// file failed while standby CQs carry traffic (the caller records it: stop_watching_real, and
// this wait then runs with real_dead, on the wake fd alone).
constexpr int kLookAgain = -3;
constexpr int kRealFailed = -4;
int wait_unreplaced(ibv_comp_channel* channel, int wake_fd, const std::vector<CqState*>& cqs,
                    bool has_shadow, bool real_dead, ibv_cq** cq, void** cq_context) {
  for (;;) {
    if (take_shadow_event(cqs, cq, cq_context)) return 0;
    // A negative fd is skipped by poll().
    pollfd fds[2] = {{real_dead ? -1 : channel->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    // Not a file's flags (EBADF): the real verb is next, and reports it.
    const int flags = fcntl(channel->fd, F_GETFL);
    const bool blocking = flags >= 0 && !(flags & O_NONBLOCK);
    const int ready = poll_for_event(fds, 2, blocking ? -1 : 0);
    if (ready < 0) return -1;  // a signal without SA_RESTART (EINTR), or poll's own failure
    if (fds[1].revents & POLLIN) {
      eventfd_t token = 0;
      eventfd_read(wake_fd, &token);
      return kLookAgain;
    }
    if (fds[0].revents & POLLIN) return -2;  // the real event is next
    // The file failed (a hang-up or error never turns into POLLIN: waiting on for it would
    // spin). With CQs on the standby their events are still to come; else the real verb
    // reports the error.
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) return has_shadow ? kRealFailed : -2;
    if (!blocking) {
      if (!real_dead) return -2;  // the real verb's EAGAIN
      errno = EAGAIN;
      return -1;
    }
  }
}

}  // namespace

void channel_created(Engine& e, ibv_comp_channel* channel) {
  if (!engine_running(e) || channel == nullptr || device_of_context(e, channel->context) < 0) {
    return;
  }
  const int real_fd = channel->fd;
  // A semaphore: one token per event due, so the fd is readable exactly while one is.
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int flags = fcntl(real_fd, F_GETFL);
  epoll_event on_real{};
  on_real.events = EPOLLIN;
  on_real.data.fd = real_fd;
  epoll_event on_wake{};
  on_wake.events = EPOLLIN;
  on_wake.data.fd = wake_fd;
  if (wake_fd < 0 || epoll_fd < 0 || flags < 0 ||
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, real_fd, &on_real) != 0 ||
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &on_wake) != 0 ||
      fcntl(real_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    VF_LOG_WARN("completion channel {}: no epoll set for its fd ({}); a thread that polls the fd "
                "itself will not wake for completions of the standby path",
                static_cast<const void*>(channel), strerror(errno));
    close_if_open(wake_fd);
    close_if_open(epoll_fd);
    return;
  }
  ChannelState& state = e.channels[channel];
  state = ChannelState{};
  state.app_channel = channel;
  state.wake_fd = wake_fd;
  state.epoll_fd = epoll_fd;
  state.real_fd = real_fd;
  channel->fd = epoll_fd;
}

ibv_comp_channel* channel_for_provider(Engine& e, ibv_comp_channel* channel,
                                       ibv_comp_channel& kernel_view) {
  if (channel == nullptr) return channel;
  auto it = e.channels.find(channel);
  if (it == e.channels.end() || it->second.epoll_fd < 0) return channel;
  kernel_view = *channel;
  kernel_view.fd = it->second.real_fd;
  kernel_view.refcnt = 0;
  return &kernel_view;
}

void adopt_channel(ibv_cq* cq, ibv_comp_channel* channel, const ibv_comp_channel& kernel_view) {
  if (cq->channel == &kernel_view) cq->channel = channel;
  if (kernel_view.refcnt <= 0) return;
  // libibverbs counted the CQ on the copy (verbs_init_cq), under the context's mutex.
  pthread_mutex_lock(&channel->context->mutex);
  channel->refcnt += kernel_view.refcnt;
  pthread_mutex_unlock(&channel->context->mutex);
}

int destroy_channel(Engine& e, ibv_comp_channel* channel, int (*real)(ibv_comp_channel*)) {
  std::lock_guard lock(e.mutex);
  auto it = e.channels.find(channel);
  if (it == e.channels.end()) return real(channel);
  ChannelState& state = it->second;
  const bool replaced = state.epoll_fd >= 0;
  if (replaced) {
    // libibverbs closes whatever channel->fd holds: it must be the real file, and only when the
    // destroy will go through (a refused destroy leaves the application's fd as it was).
    pthread_mutex_lock(&channel->context->mutex);
    const bool busy = channel->refcnt != 0;
    if (!busy) channel->fd = state.real_fd;
    pthread_mutex_unlock(&channel->context->mutex);
    if (busy) return EBUSY;
  }
  const int result = real(channel);
  if (result != 0) {
    if (replaced) channel->fd = state.epoll_fd;
    return result;
  }
  close_if_open(state.epoll_fd);
  close_if_open(state.wake_fd);
  if (state.shadow_channel != nullptr && e.verbs.destroy_comp_channel(state.shadow_channel) != 0) {
    VF_LOG_WARN("completion channel {}: its shadow channel on the backup device could not be "
                "destroyed (left open)",
                static_cast<const void*>(channel));
  }
  e.channels.erase(it);
  wake_engine(e);  // it may be polling the shadow channel's fd
  return 0;
}

namespace {

struct ChannelView {
  bool known = false;
  bool replaced = false;
  bool real_dead = false;
  bool has_shadow = false;
  int wake_fd = -1;
  int real_fd = -1;
  std::vector<CqState*> cqs;
};

ChannelView view_of(Engine& e, ibv_comp_channel* channel) {
  ChannelView view;
  std::lock_guard lock(e.mutex);
  auto it = e.channels.find(channel);
  if (it == e.channels.end()) return view;
  const ChannelState& state = it->second;
  view.known = state.epoll_fd >= 0 || state.shadow_channel != nullptr;
  view.replaced = state.epoll_fd >= 0;
  view.real_dead = state.real_dead;
  view.wake_fd = state.wake_fd;
  view.real_fd = state.real_fd;
  view.cqs = state.cqs;
  for (const CqState* cq : state.cqs) view.has_shadow = view.has_shadow || cq->shadow != nullptr;
  return view;
}

// The real event file failed (EIO: its device was removed or reset) while the standby's CQs
// carry the traffic: it leaves the epoll set, or the application's fd would read as ready (its
// EPOLLERR) for good while every ibv_get_cq_event failed; a channel whose fd was not replaced
// waits on the wake fd alone from then on. Recorded once, logged once.
void stop_watching_real(Engine& e, ibv_comp_channel* channel, int error) {
  std::lock_guard lock(e.mutex);
  auto it = e.channels.find(channel);
  if (it == e.channels.end() || it->second.real_dead) return;
  it->second.real_dead = true;
  if (it->second.epoll_fd >= 0) {
    epoll_ctl(it->second.epoll_fd, EPOLL_CTL_DEL, it->second.real_fd, nullptr);
  }
  VF_LOG_WARN("completion channel {}: its event file on the primary device failed ({}); its "
              "events now come from the standby path alone",
              static_cast<const void*>(channel), strerror(error));
}

}  // namespace

int get_cq_event(Engine& e, ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  for (;;) {
    ChannelView view = view_of(e, channel);
    if (!view.known) return -2;
    if (!view.replaced) {
      const int result = wait_unreplaced(channel, view.wake_fd, view.cqs, view.has_shadow,
                                         view.real_dead, cq, cq_context);
      if (result == kRealFailed) {
        stop_watching_real(e, channel, EIO);  // what a read() of the failed file gives
        continue;
      }
      if (result == kLookAgain) continue;
      return result;
    }
    // The eventfd is a semaphore with one token per shadow event counted (the engine counts,
    // then writes): a token taken is an event to hand out. Its CQ may be newer than the view
    // (look again) or destroyed meanwhile (the token is void).
    eventfd_t token = 0;
    if (eventfd_read(view.wake_fd, &token) == 0) {
      if (take_shadow_event(view.cqs, cq, cq_context)) return 0;
      if (take_shadow_event(view_of(e, channel).cqs, cq, cq_context)) return 0;
      continue;
    }
    if (!view.real_dead) {
      ibv_comp_channel kernel_view = *channel;
      kernel_view.fd = view.real_fd;  // O_NONBLOCK: an empty file is EAGAIN
      if (e.verbs.get_cq_event(&kernel_view, cq, cq_context) == 0) return 0;
      const int error = errno;
      if (error != EAGAIN && error != EWOULDBLOCK) {
        if (!view.has_shadow) return -1;  // nothing else can come: as without the shim
        stop_watching_real(e, channel, error);
        continue;
      }
    }
    const int flags = fcntl(channel->fd, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK)) {
      errno = EAGAIN;  // what libibverbs gives on the application's non-blocking fd
      return -1;
    }
    // A signal without SA_RESTART ends the wait with EINTR, as the read() of the real file does.
    pollfd wait{channel->fd, POLLIN, 0};
    if (poll_for_event(&wait, 1, -1) < 0) return -1;
  }
}

}  // namespace vf::failover
