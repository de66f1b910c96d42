// rdma_cm's disconnect carried over the control channel (issue 20 item 9, docs/design.md §5j).
// rdma_disconnect sends the CM's DREQ on the device of the application's QP: after a cut of that
// rail it never arrives, and a peer that waits for RDMA_CM_EVENT_DISCONNECTED (rping's server)
// waits for ever. The side that disconnects also says so on the control channel (CmDisconnect,
// resent until answered or its bound passes) before the CM's own request; the other side's shim
// hands the QP to the rdma_cm hooks (shim/rdma_cm_hooks.cc), which give the application the
// event. Whichever of the two arrives first is the one the application sees (the hooks drop the
// second).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>

#include "core/failover/engine_state.h"

namespace vf::failover {

// The application's thread, in rdma_disconnect, before the CM's own request: tells the peer's
// shim and waits (releasing the lock) until it answers or `wait_ns` passes. kNotSent: the QP is
// not paired with another shim's, or its peer disconnected it first (the CM then only answers;
// telling the peer again would wait on a process that may be gone).
enum class CmAnnounce { kNotSent, kUnanswered, kAnswered };
CmAnnounce announce_cm_disconnect(Engine& e, std::unique_lock<std::mutex>& lock, VirtualQp* qp,
                                  std::uint64_t wait_ns);

// A CmDisconnect request about a QP this process no longer has (destroyed: its keys are gone):
// answered all the same, on the session it came on, so that its sender does not wait its bound.
void answer_unknown_cm_disconnect(Engine& e, const PeerRef& from, const CmDisconnect& m);

// The engine's thread: sends (again, every kCmDisconnectResendNs) the announcements not yet
// answered, on every route to the peer. True while one is outstanding (poll at a short period).
bool send_cm_disconnects(Engine& e);

// A CmDisconnect from the pair's peer (found by the caller): an answer wakes the waiting
// application thread; a request is answered and, the first time, the QP is queued for the
// handler, due after kCmDisconnectGraceNs (the CM's own event may come meanwhile). The asker's
// own QP is queued the same way once answered (announce_cm_disconnect).
void handle_cm_disconnect(Engine& e, Protection& p, const CmDisconnect& m);

// The queued QPs whose grace passed, handed to the handler by the engine's thread once it
// released the lock.
void run_cm_disconnect_handler(Engine& e, std::unique_lock<std::mutex>& lock);

}  // namespace vf::failover
