// The application's completion channels: their fd wakes for an event of either path (issue 19
// item 4a). A program that sleeps in poll/epoll on channel->fd itself (rsockets, UCX and
// libfabric progress threads) never calls into the shim while it sleeps, so the shim cannot wake
// it from ibv_get_cq_event: the fd itself must become readable when a standby CQ fires.
//
// How: at ibv_create_comp_channel on a device the engine serves, channel->fd is replaced by an
// epoll fd watching the channel's real event file and an eventfd the engine writes for each
// shadow-CQ event (engine_thread.cc). The real file is kept (O_NONBLOCK) and handed to the
// provider and to libibverbs through a copy of the struct wherever they read channel->fd:
// ibv_create_cq / ibv_create_cq_ex and the providers' mlx5dv_create_cq / efadv_create_cq
// (shim/verbs_hooks/dv_cq_hooks.cc; the kernel finds the channel by that fd), ibv_get_cq_event,
// and ibv_destroy_comp_channel (which closes it). The application's own view stays: its fd is
// pollable, O_NONBLOCK set on it is honoured, refcnt counts its CQs, destroy is EBUSY while a CQ
// uses it.
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// After a successful ibv_create_comp_channel (engine mutex held). Leaves the channel as it is
// (events of the standby then wake only a thread inside ibv_get_cq_event) when the engine does
// not serve its device or the epoll set cannot be had; the latter is logged.
void channel_created(Engine& e, ibv_comp_channel* channel);

// Before the provider creates a CQ on `channel` (engine mutex held): the struct to hand it, a
// copy in `kernel_view` holding the real event file when the channel's fd was replaced, else
// `channel` itself.
ibv_comp_channel* channel_for_provider(Engine& e, ibv_comp_channel* channel,
                                       ibv_comp_channel& kernel_view);
// After the provider created `cq` with `kernel_view` (no lock needed): the CQ points to the
// application's channel and its refcnt counts the CQ, as if it had been created with it.
void adopt_channel(ibv_cq* cq, ibv_comp_channel* channel, const ibv_comp_channel& kernel_view);

// ibv_destroy_comp_channel: EBUSY while a CQ uses the channel (nothing changed), else the real
// destroy with the real event file in channel->fd, then the shim's fds and the shadow channel
// go. Takes the engine mutex itself.
int destroy_channel(Engine& e, ibv_comp_channel* channel, int (*real)(ibv_comp_channel*));

// ibv_get_cq_event: an event of the shadow CQs first, then one of the real file; blocks (unless
// the application made its fd O_NONBLOCK: -1 with EAGAIN, as libibverbs) on the application's
// fd, which wakes for both. -2 when the channel is not the engine's business. Takes the engine
// mutex itself, briefly: the wait is without it.
int get_cq_event(Engine& e, ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);

}  // namespace vf::failover
