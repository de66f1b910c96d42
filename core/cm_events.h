// The rdma_cm events the shim adds to an application's event channel (issue 20 item 9,
// docs/design.md §5j): RDMA_CM_EVENT_DISCONNECTED when the peer's application disconnected but
// the CM's own request (DREQ) could not arrive, its path being the dead primary rail.
//
// The peer's shim says so over the control channel (core/failover/cm_disconnect.h); this keeps
// the rdma_cm ids whose QPs the shim knows (learned from their ESTABLISHED event) and gives the
// event through the application's own rdma_get_cm_event. An application blocked in that call
// (or in poll() on the channel's fd) is woken by a real event: a helper id on the same channel
// resolves an address, and its event, never shown, stands for the DISCONNECTED one. Each id gets
// one DISCONNECTED: whichever of the CM's and the shim's comes first, the other is dropped.
// The side that disconnected gets its own DISCONNECTED once the peer's shim confirmed (its CM
// would wait for the answer to a request sent over the dead path). No loader tricks here: the
// real librdmacm functions are given (shim/rdma_cm_hooks.cc).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>

namespace vf {

struct RdmaCmApi {
  int (*get_cm_event)(rdma_event_channel*, rdma_cm_event**) = nullptr;
  int (*ack_cm_event)(rdma_cm_event*) = nullptr;
  int (*create_id)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space) = nullptr;
  int (*resolve_addr)(rdma_cm_id*, sockaddr*, sockaddr*, int) = nullptr;
  int (*destroy_id)(rdma_cm_id*) = nullptr;
};

class CmEvents {
 public:
  // The context of the shim's helper ids: their events are told from the application's by it
  // (an address can be reused by a new id of either kind as soon as one is freed).
  static void* helper_context();
  // How long the helper's address resolution may take (its event wakes the reader either way:
  // resolved or failed).
  static constexpr int kHelperResolveTimeoutMs = 2000;
  // Peer disconnects remembered for QPs whose ESTABLISHED was not read yet (a bound: a QP that
  // never gets there must not grow it).
  static constexpr std::size_t kMaxEarlyDisconnects = 1024;

  explicit CmEvents(const RdmaCmApi& api) : api_(api) {}

  // rdma_get_cm_event, with the shim's events and without the helpers' or a second
  // DISCONNECTED. Returns as the real one does.
  int get_event(rdma_event_channel* channel, rdma_cm_event** event);
  // rdma_ack_cm_event: the shim's own events are freed here; true when `event` was one of them.
  bool ack_own_event(rdma_cm_event* event);
  // Before rdma_destroy_id: the id and its pending events are forgotten, and this waits until
  // the application acknowledged every event of the shim it got for the id (librdmacm's destroy
  // waits for its own events the same way; it frees the id). id->event (a synchronous id's
  // last event, which the real destroy acknowledges itself) is not waited for.
  void before_destroy(rdma_cm_id* id);
  // After the real rdma_destroy_id returned: the id is forgotten (before_destroy kept it, marked,
  // so that a second DISCONNECTED read meanwhile by another thread is still dropped).
  void after_destroy(rdma_cm_id* id);
  // The engine's thread: the connection of this QP was disconnected (by the peer, or here with
  // the peer's shim's confirmation) and the CM's own DISCONNECTED has not come within the grace
  // (kCmDisconnectGraceNs): the id gets the shim's, unless it got the CM's meanwhile.
  void disconnected(ibv_qp* qp, std::uint32_t qpn);
  // Whether the id already got its DISCONNECTED (the CM's or the shim's).
  bool disconnect_shown(rdma_cm_id* id);

  // For tests.
  std::size_t ids_known();

 private:
  struct IdState {
    ibv_qp* qp = nullptr;
    std::uint32_t qpn = 0;
    bool disconnect_shown = false;
    bool destroying = false;  // between before_destroy and after_destroy
  };

  // Makes the id's DISCONNECTED and gives it to the reader of the id's channel: through a
  // helper's event when one can be made (resolving the id's own address, else the loopback of
  // its family), else at the channel's next rdma_get_cm_event. Under mu_ (the id is known, so
  // the application cannot destroy it or its channel meanwhile).
  void give_disconnected_locked(rdma_cm_id* id);
  // One of the shim's events for this channel that can be shown now, or null. Under mu_.
  rdma_cm_event* take_ready(rdma_event_channel* channel);
  // Whether the shim's event may be shown: its id is known, not being destroyed, and has not had
  // its DISCONNECTED (marked as had). Under mu_.
  bool may_show_own(rdma_cm_event* own);
  rdma_cm_event* show(rdma_cm_event* own);  // pending -> shown; under mu_

  const RdmaCmApi api_;
  std::mutex mu_;
  std::condition_variable acked_;  // an event of the shim was acknowledged
  std::map<rdma_cm_id*, IdState> ids_;
  std::map<rdma_cm_id*, rdma_cm_event*> helpers_;  // helper id -> the event it stands for
  std::map<rdma_event_channel*, std::deque<rdma_cm_event*>> ready_;
  std::set<rdma_cm_event*> pending_;  // the shim's events not shown yet (id null: destroyed)
  std::set<rdma_cm_event*> shown_;    // the shim's events the application has, until acked
  std::deque<std::pair<ibv_qp*, std::uint32_t>> early_;
};

}  // namespace vf
