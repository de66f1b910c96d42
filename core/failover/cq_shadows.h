// CQs and completion channels: the record of each application CQ (CqState, the data path's), its
// shadow CQ on the backup device with a shadow completion channel when the application's CQ has
// one, and ibv_ack_cq_events / ibv_req_notify_cq on such channels (ibv_get_cq_event and the
// channel's fd: channel_wakeup.h).
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Entry points (FailoverEngine, engine mutex held): after ibv_create_cq, before ibv_destroy_cq
// (the shadow goes first), after a successful ibv_resize_cq.
void cq_created(Engine& e, ibv_cq* cq, ibv_comp_channel* channel);
void cq_destroying(Engine& e, ibv_cq* cq);
// ibv_destroy_cq's first step: false when a QP still uses the CQ (the provider will refuse with
// EBUSY: nothing changes); else no shadow event of the CQ is handed out or announced any more,
// and the caller waits (without the mutex) for those handed out to be acknowledged.
bool cq_close_events(Engine& e, ibv_cq* cq);
void cq_resized(Engine& e, ibv_cq* cq);

// The shadow CQ of an application CQ on the backup device (with a shadow completion channel
// when the application's CQ has one). False if it cannot be had there.
bool ensure_shadow(Engine& e, CqState& state, int backup_device);

// A protected QP of this CQ has its standby on the shadow: room for what the shim adds there
// itself (`entries`: a drain marker per QP whose receives land here), so that the shadow cannot
// overrun where the application's CQ would not (issue 19 item 9), or a probe's completion per QP
// whose standby is probed. Grows the shadow when needed; false (the entries counted all the
// same) when the device would not grow it.
bool reserve_shadow_entries(Engine& e, CqState& state, std::uint32_t entries);

// After a failback: once no QP of the CQ runs on the standby (or is switching), ibv_poll_cq stops
// polling the shadow (the healthy path is as before the failover: issue 19 item 11). What the
// shadow still holds (the old standby QP's flushes, hidden) is drained first; a later switch to
// the standby sets shadow_active again before the standby accepts anything.
void retire_shadow_if_unused(Engine& e, CqState& cq);

// How many of nevents belong to the application's CQ (the rest were shadow events). Lock-free.
unsigned int ack_cq_events(ibv_cq* cq, unsigned int nevents);
// ibv_req_notify_cq: also arms the shadow. Lock-free.
void req_notify(ibv_cq* cq, int solicited_only);

}  // namespace vf::failover
