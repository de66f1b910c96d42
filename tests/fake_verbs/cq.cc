// FAKE libibverbs (verbs-failover test double) — completion queues and completion channels.
// A channel's fd is a semaphore eventfd: each CQ event adds one count, so poll()/select() on it
// and a blocking ibv_get_cq_event behave like the real uverbs event file.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "internal.h"

using namespace fake_verbs;

FAKE_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  auto lock = fabric_lock();
  int fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto* ch = new CompChannel();
  ch->shell.impl = ch;
  ch->ctx = to_ctx(context);
  ch->fd = fd;
  ++ch->ctx->live_objects;
  ch->shell.channel.context = context;
  ch->shell.channel.fd = fd;
  ch->shell.channel.refcnt = 0;
  fabric().channels_by_fd[fd] = ch;
  return &ch->shell.channel;
}

// As libibverbs: EBUSY while the struct's refcnt counts CQs, else close whatever fd the struct
// holds and free it. Real libibverbs would then leak the channel's event file (the struct held
// another fd, which it closes) or leave CQs on a freed channel (a refcnt someone got wrong): the
// fake stops the program there (fake_fatal).
FAKE_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto lock = fabric_lock();
  CompChannel* ch = to_channel(channel);
  if (channel->refcnt != 0) return EBUSY;
  const int closed = channel->fd;
  close(closed);
  if (closed != ch->fd) {
    fake_fatal("ibv_destroy_comp_channel: the struct holds fd %d, not the channel's event file "
               "%d: libibverbs closes fd %d and leaks the channel", closed, ch->fd, closed);
  }
  if (ch->cq_refs != 0) {
    fake_fatal("ibv_destroy_comp_channel: %d CQs still use the channel though its refcnt is 0",
               ch->cq_refs);
  }
  fabric().channels_by_fd.erase(ch->fd);
  ch->fd = -1;
  --ch->ctx->live_objects;
  delete ch;
  return 0;
}

namespace {

ibv_cq* create_cq_locked(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                         uint32_t comp_vector) {
  if (cqe < 1 || cqe > kMaxCqe || comp_vector >= uint32_t(context->num_comp_vectors)) {
    errno = EINVAL;
    return nullptr;
  }
  // The kernel finds the channel by the fd the struct holds at this moment (uverbs' lookup of a
  // comp-channel file): any other file is EBADF.
  CompChannel* kernel_channel = nullptr;
  if (channel != nullptr) {
    auto found = fabric().channels_by_fd.find(channel->fd);
    if (found == fabric().channels_by_fd.end() || found->second->ctx != to_ctx(context)) {
      errno = EBADF;
      return nullptr;
    }
    kernel_channel = found->second;
  }
  auto* cq = new Cq();
  cq->shell.impl = cq;
  cq->ctx = to_ctx(context);
  ++cq->ctx->live_objects;
  cq->capacity = cqe;
  ibv_cq* c = cq->ibcq();
  c->context = context;
  c->channel = channel;
  c->cq_context = cq_context;
  c->cqe = cqe;  // exactly what was asked: overflow tests can count on it
  c->handle = fabric().next_key++;
  pthread_mutex_init(&c->mutex, nullptr);
  pthread_cond_init(&c->cond, nullptr);
  if (channel != nullptr) {
    ++channel->refcnt;  // verbs_init_cq: the struct it was given, whatever it is
    cq->channel = kernel_channel;
    ++cq->channel->cq_refs;
  }
  return c;
}

}  // namespace

FAKE_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                  ibv_comp_channel* channel, int comp_vector) {
  auto lock = fabric_lock();
  if (comp_vector < 0) {
    errno = EINVAL;
    return nullptr;
  }
  return create_cq_locked(context, cqe, cq_context, channel, uint32_t(comp_vector));
}

namespace fake_verbs {

// ibv_create_cq_ex (through verbs_context::create_cq_ex): same CQ, plus the start_poll /
// next_poll / end_poll / read_* iterator. Completion timestamps, flow tags, CVLAN and tag
// matching are not modelled: asking for them is EOPNOTSUPP.
ibv_cq_ex* create_cq_ex_op(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  const uint64_t supported = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                             IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                             IBV_WC_EX_WITH_DLID_PATH_BITS;
  if ((attr->wc_flags & ~supported) != 0 ||
      (attr->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS)) != 0 ||
      ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && attr->flags != 0)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  auto lock = fabric_lock();
  ibv_cq* c =
      create_cq_locked(context, int(attr->cqe), attr->cq_context, attr->channel, attr->comp_vector);
  if (c == nullptr) return nullptr;
  Cq* cq = to_cq(c);
  cq->extended = true;
  cq->wc_flags = attr->wc_flags;
  fill_cq_ex_ops(&cq->shell.cqx);
  return &cq->shell.cqx;
}

}  // namespace fake_verbs

FAKE_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  auto lock = fabric_lock();
  Cq* cq = to_cq(ibcq);
  if (cq->qp_refs != 0) return EBUSY;
  // libibverbs waits until every event the kernel reported for the CQ was acknowledged: for ever
  // if more were acknowledged, or if the program (one thread) still owes some.
  if (cq->events_acked != cq->events_delivered) {
    fake_fatal("ibv_destroy_cq: %u event(s) delivered, %u acknowledged: libibverbs would wait "
               "for ever", cq->events_delivered, cq->events_acked);
  }
  if (ibcq->channel != nullptr) --ibcq->channel->refcnt;  // libibverbs, through cq->channel
  if (cq->channel != nullptr) {
    // Forget events of this CQ nobody fetched yet, keeping the eventfd count in step.
    auto& evs = cq->channel->events;
    int fd = cq->channel->fd;
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    for (auto it = evs.begin(); it != evs.end();) {
      if (*it == cq) {
        uint64_t v;
        ssize_t r = read(fd, &v, sizeof v);
        (void)r;
        it = evs.erase(it);
      } else {
        ++it;
      }
    }
    fcntl(fd, F_SETFL, flags);
    --cq->channel->cq_refs;
  }
  pthread_mutex_destroy(&ibcq->mutex);
  pthread_cond_destroy(&ibcq->cond);
  --cq->ctx->live_objects;
  delete cq;
  return 0;
}

// ibv_resize_cq: grows or shrinks the CQ to exactly `cqe` (cq->cqe updated, like create's
// "exactly what was asked"). EINVAL, nothing changed, if cqe < 1, cqe > the device's max_cqe, or
// fewer than the completions currently queued (they are kept, in order). A CQ that already
// overflowed stays broken. Not a progress step.
FAKE_EXPORT int ibv_resize_cq(ibv_cq* ibcq, int cqe) {
  auto lock = fabric_lock();
  Cq* cq = to_cq(ibcq);
  if (cqe < 1 || cqe > kMaxCqe || size_t(cqe) < cq->entries.size()) return EINVAL;
  fake_log("ibv_resize_cq: %d -> %d entries (%zu queued)", cq->capacity, cqe, cq->entries.size());
  cq->capacity = cqe;
  ibcq->cqe = cqe;
  return 0;
}

// Reads an event from whatever file channel->fd is (as libibverbs' read() of the uverbs event
// file): a struct that is a copy with the same fd works, a struct whose fd is another file fails.
FAKE_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq_out, void** cq_context) {
  uint64_t count;
  const int fd = channel->fd;
  if (read(fd, &count, sizeof count) != sizeof count) return -1;
  auto lock = fabric_lock();
  auto found = fabric().channels_by_fd.find(fd);
  if (found == fabric().channels_by_fd.end()) {
    errno = EIO;
    return -1;
  }
  CompChannel* ch = found->second;
  if (ch->events.empty()) {
    errno = EIO;
    return -1;
  }
  Cq* cq = ch->events.front();
  ch->events.pop_front();
  ++cq->events_delivered;
  *cq_out = cq->ibcq();
  *cq_context = cq->ibcq()->cq_context;
  return 0;
}

FAKE_EXPORT void ibv_ack_cq_events(ibv_cq* ibcq, unsigned int nevents) {
  auto lock = fabric_lock();
  to_cq(ibcq)->events_acked += nevents;
  ibcq->comp_events_completed += nevents;
}

namespace fake_verbs {

// Polling is a progress step: pending work of every QP advances before completions are read.
int poll_cq_op(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
  if (num_entries < 0) return -EINVAL;
  auto lock = fabric_lock();
  progress_step_locked();
  Cq* cq = to_cq(ibcq);
  int n = 0;
  while (n < num_entries && !cq->entries.empty()) {
    wc[n++] = cq->entries.front();
    cq->entries.pop_front();
  }
  if (n == 0 && cq->overflowed) {
    errno = EOVERFLOW;
    return -EOVERFLOW;  // the CQ lost completions: it is unusable, as after a real CQ overrun
  }
  return n;
}

// Arming with completions already queued does not fire: like hardware, only a completion that
// arrives after arming generates an event (callers poll once more after arming).
int req_notify_cq_op(ibv_cq* ibcq, int solicited_only) {
  auto lock = fabric_lock();
  Cq* cq = to_cq(ibcq);
  cq->armed = true;
  cq->armed_solicited_only = solicited_only != 0;
  return 0;
}

}  // namespace fake_verbs

// A provider's own CQ creation, reached without libibverbs' verbs_context op (as
// mlx5dv_create_cq reaches mlx5's): for tests of direct-verbs paths (tests/preload/fake_dv_lib.c).
// Like the provider, it hands attr->channel->fd to the "kernel".
FAKE_EXPORT ibv_cq_ex* fake_verbs_provider_create_cq_ex(ibv_context* context,
                                                        ibv_cq_init_attr_ex* attr) {
  return fake_verbs::create_cq_ex_op(context, attr);
}
