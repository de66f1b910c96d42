// The control side of failover (docs/design.md §5): which device backs up which, the shadow
// objects on the backup device (PD, MR, CQ, standby QP), pairing with the peer's shim over the
// control channel, the switch protocol (drain, exchange delivered counts, replay), re-arming a
// path that came back, failback, and the stats file. It runs on one thread of its own; the
// shim's hooks call the on_* functions from the application's threads (control path only) and
// reach the data path through the VirtualQp and CqState records it registers. This class is the
// API only: the work is done by the rooms of core/failover/ (docs/design.md §5 has their map).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/verbs_api.h"
#include "core/virtual_qp.h"
#include "core/virtual_srq.h"

namespace vf {

class FailoverEngine {
 public:
  static FailoverEngine& instance();

  // Once, at the shim's initialisation: nothing is opened or started until a device is.
  void configure(const Config& config, const VerbsApi& verbs, std::string program);

  // The application opened a device: the first call discovers every device, opens the engine's
  // own contexts, chooses backups, starts the listener and the thread.
  void on_device_opened(ibv_context* context);
  void on_cq_created(ibv_cq* cq, ibv_comp_channel* channel);
  // Before the provider destroys the CQ (its shadow goes first).
  void on_cq_destroy(ibv_cq* cq);
  void on_cq_resized(ibv_cq* cq);  // after a successful ibv_resize_cq
  void on_pd_destroy(ibv_pd* pd);
  // A basic SRQ the application created (its QPs are protected with it), resized, destroyed.
  void on_srq_created(ibv_srq* srq, ibv_pd* pd);
  void on_srq_modified(ibv_srq* srq, ibv_srq_attr* attr, int mask);
  void on_srq_destroyed(ibv_srq* srq);  // after the provider destroyed it
  void on_qp_created(ibv_qp* qp, const ibv_qp_init_attr_ex& attr);
  // The whole ibv_modify_qp of a QP: adjusts what the primary needs (a shorter transport
  // timeout), calls `real`, and follows the QP's life (INIT, RTR: pairing starts; ERR: the
  // application's own).
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask,
                int (*real)(ibv_qp*, ibv_qp_attr*, int));
  // After a successful ibv_query_qp, given qp->state from before it (libibverbs overwrote it
  // with the provider's state): a protected QP reads the state the application set, whatever
  // its physical one (in qp->state and in attr).
  void on_qp_queried(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_state application_view);
  void on_qp_destroy(ibv_qp* qp);  // before the provider destroys it
  void on_mr_registered(ibv_mr* mr, void* addr, std::size_t length, std::uint64_t iova,
                        unsigned int access, int dmabuf_fd, std::uint64_t dmabuf_offset);
  void on_mr_deregister(ibv_mr* mr);  // before the provider deregisters it
  // After a successful ibv_rereg_mr (the MR's fields are the new ones; its old keys given).
  void on_mr_reregistered(ibv_mr* mr, int flags, std::uint32_t old_lkey, std::uint32_t old_rkey,
                          int access);
  // Whether an async event the application is about to get must be hidden (a protected port's
  // PORT_ERR/PORT_ACTIVE, a protected QP's fatal events). Counted.
  bool hide_async_event(ibv_context* context, const ibv_async_event& event);

  // Data-path lookups (lock-free).
  VirtualQp* virtual_qp(const ibv_qp* qp) const;
  CqState* cq_state(const ibv_cq* cq) const;
  VirtualSrq* virtual_srq(const ibv_srq* srq) const;

  // Completion channels (core/failover/channel_wakeup.h): after a successful
  // ibv_create_comp_channel; around the provider's CQ creation on one (the struct to give it,
  // then the CQ adopted by the application's channel); ibv_destroy_comp_channel whole.
  void on_comp_channel_created(ibv_comp_channel* channel);
  ibv_comp_channel* channel_for_provider(ibv_comp_channel* channel,
                                         ibv_comp_channel& kernel_view);
  void adopt_channel(ibv_cq* cq, ibv_comp_channel* channel, const ibv_comp_channel& kernel_view);
  int destroy_comp_channel(ibv_comp_channel* channel, int (*real)(ibv_comp_channel*));
  // ibv_get_cq_event on a channel with shadow CQs: waits on both, returns like the real one.
  // Returns -2 when the channel is not the engine's business (the caller uses the real verb).
  int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
  // Before ibv_destroy_cq: unless a QP still uses the CQ (the destroy will be EBUSY: no wait,
  // as libibverbs), no shadow event of it is handed out any more, and this waits until the
  // application acknowledged each one it got (rdma-core waits for its own events the same way
  // once the destroy went through).
  void close_cq_events(ibv_cq* cq);
  // ibv_ack_cq_events: how many of these belong to the real CQ (the rest were shadow events).
  unsigned int ack_cq_events(ibv_cq* cq, unsigned int nevents);
  // ibv_req_notify_cq: also arms the shadow.
  void on_req_notify(ibv_cq* cq, int solicited_only);

  // rdma_cm (shim/rdma_cm_hooks.cc, core/failover/cm_disconnect.h): the application is about to
  // rdma_disconnect the connection of this QP: its peer's shim is told, and this waits (bounded)
  // for its answer. True when the peer's shim answered; false when nothing was sent (not
  // paired, or the peer disconnected first) or no answer came.
  bool announce_cm_disconnect(ibv_qp* qp);
  // Who gives the application RDMA_CM_EVENT_DISCONNECTED when the peer disconnected this QP;
  // called on the engine's thread without its lock.
  void set_cm_disconnect_handler(void (*handler)(ibv_qp* qp, std::uint32_t qpn));

  void write_stats(const char* reason);
  // What the stats file would say of the QP whose application QPN is qpn: 1 protected, 0 not
  // (reason says why), -1 the engine does not know it. For tests (verbs_failover_debug_*).
  int protection_of(std::uint32_t qpn, std::string& reason);
  // The path that QP uses (0 primary, 1 standby, 2 switching; -1 not protected) and its switches.
  // For benchmarks and tests (verbs_failover_debug_*).
  int switches_of(std::uint32_t qpn, std::uint64_t* failovers, std::uint64_t* failbacks);
  // The interval after which an unanswered re-arm request, or an answerer's notice that its
  // port is back, is sent again (default 5 s). For tests (verbs_failover_debug_*).
  void set_rearm_retry(std::uint64_t nanoseconds);
  // How long after a switch with work outstanding, and no completion since, the engine
  // describes both paths in its log (default 5 s). For tests (verbs_failover_debug_*).
  void set_resume_late(std::uint64_t nanoseconds);
  // The first hold-down of a path that failed silently (default 10 s). For tests.
  void set_first_hold_down(std::uint64_t nanoseconds);
  // The next `count` control messages of the named kind (kControlMessageNames) this process
  // sends are lost; returns how many of that kind are still to lose, or -1 for an unknown name.
  // count 0 only asks. For tests (verbs_failover_debug_lose_control).
  int lose_control_messages(std::string_view kind, unsigned count);
  // fork(): the child has no engine thread and must not use the parent's objects.
  void forget_after_fork();
  void lock_for_fork();
  void unlock_after_fork();
  bool running() const;
};

}  // namespace vf
