/*
 * FAKE libibverbs (verbs-failover test double) — fault-injection and inspection API.
 *
 * These functions are exported ONLY by the fake libibverbs.so.1 built from tests/fake_verbs/,
 * under the version node FAKE_VERBS_1.0. Test programs link the real libibverbs and run with
 * LD_LIBRARY_PATH pointing at the fake, so resolve them at run time, e.g.
 *
 *   auto port_down = (int (*)(int))dlvsym(RTLD_DEFAULT, "fake_verbs_port_down", "FAKE_VERBS_1.0");
 *
 * (finding them at all proves the process really talks to the fake). All calls are thread-safe
 * and deterministic; see docs/fake_verbs.md for the progress model they interact with.
 * Device indexes are those of ibv_get_device_index(): fake<N> has index N. QP numbers are unique
 * across all fake devices.
 */
#ifndef FAKE_VERBS_CONTROL_H
#define FAKE_VERBS_CONTROL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_VERBS_CONTROL_VERSION "FAKE_VERBS_1.0"

/* Always returns 1. Its presence identifies the fake. */
int fake_verbs_is_fake(void);

/* Number of fake devices (VF_FAKE_VERBS_DEVICES, default 4). */
int fake_verbs_device_count(void);

/* Port down: the port reports IBV_PORT_DOWN, every open context of the device gets
 * IBV_EVENT_PORT_ERR, and every QP on the device with outstanding send WRs completes the oldest
 * with IBV_WC_RETRY_EXC_ERR, goes to ERR and flushes the rest (and its receives) with
 * IBV_WC_WR_FLUSH_ERR. Later sends on the device fail the same way when they are executed.
 * Peers sending TO the device see a dead path (transport retries, then RETRY_EXC_ERR).
 * Returns 0, or -1 for a bad index. Idempotent: no event if already down. */
int fake_verbs_port_down(int device_index);

/* Port up: IBV_PORT_ACTIVE again and IBV_EVENT_PORT_ACTIVE on every open context. QPs already in
 * ERR stay there (as on hardware: the application must reset/recreate them). */
int fake_verbs_port_up(int device_index);

/* The GID at index 'from' moves to the empty slot 'to', as when the kernel removes an address and
 * adds it again at the first free slot (another address took the old one, or a QP still holds
 * it): 'from' becomes empty, so a QP moved to RTR, or an address handle made, with that index
 * fails with ENODATA, while QPs already connected keep working. Every open context of the device
 * gets IBV_EVENT_GID_CHANGE. Returns 0, or -1 for a bad index, an empty 'from' or a used 'to'. */
int fake_verbs_move_gid(int device_index, int from, int to);

/* Silent drop on/off: every packet to or from the device vanishes with no port event. Senders
 * count one transport try per progress step and fail with IBV_WC_RETRY_EXC_ERR once tries exceed
 * the QP's retry_cnt (so retry_cnt+1 tries; retry_cnt 0 fails in the posting call's own step).
 * A WR held on the wire by an injected delay (fake_verbs_set_delay) is lost the same way. */
int fake_verbs_set_drop(int device_index, int enabled);

/* Deliveries to or from the device are held for 'steps' progress steps (the larger of the two
 * ends' delays applies; fixed when the WR is posted). 0 = deliver in the posting call. */
int fake_verbs_set_delay(int device_index, unsigned steps);

/* Receive completions (successes and flushes, in order) of the device's QPs reach their CQ
 * 'steps' progress steps after the message was placed and acknowledged; the requester's send
 * completes at once. Models a device that writes the receive CQE after sending the ACK.
 * 0 = at once. Returns 0, or -1 for a bad index. */
int fake_verbs_set_recv_completion_delay(int device_index, unsigned steps);

/* Flush on modify only on/off: a receive posted to a QP of the device that is already in ERR is
 * not flushed at once (IB C10-42) but waits in the receive queue until the QP is moved to ERR
 * again (ERR -> ERR), which flushes it. Models rxe, whose responder flushes a receive queue only
 * when it runs, and a move to ERR is what schedules it. Returns 0, or -1 for a bad index. */
int fake_verbs_set_flush_on_modify_only(int device_index, int enabled);

/* Retry without end at 7 on/off: a requester on the device whose QP has retry_cnt 7 retries a
 * lost packet for ever and never completes it with IBV_WC_RETRY_EXC_ERR. Models rxe, which
 * decrements the retry count only when it is not 7 (the IB spec counts 7 retries). Returns 0, or
 * -1 for a bad index. */
int fake_verbs_set_retry_without_end_at_7(int device_index, int enabled);

/* The acknowledgements of the next 'count' requests from QPs on the device are lost: the
 * responder executes each (data placed, receive completed) but the requester sees nothing and
 * retries it, one transport try per progress step like a lost packet; a retry reaching the
 * responder is recognised by its PSN and acknowledged without executing it again; a requester
 * whose retries run out first (the path died) completes it with IBV_WC_RETRY_EXC_ERR though it
 * executed. Returns 0, or -1 for a bad index. */
int fake_verbs_set_lose_acks(int device_index, unsigned count);

/* Runs one progress step (same as what every post/poll call does). */
void fake_verbs_progress(void);

/* Number of progress steps run since the library was loaded. */
uint64_t fake_verbs_progress_steps(void);

struct fake_verbs_qp_stats {
  uint64_t messages_sent;          /* requests delivered to and accepted by the peer */
  uint64_t messages_received;      /* requests this QP accepted as responder */
  uint64_t rnr_naks;               /* RNR NAKs this QP received as requester */
  uint64_t transport_retries;      /* tries lost to drop/port down/missing peer */
  uint64_t completions_with_error; /* error CQEs (incl. flushes) generated for this QP's sends */
  uint64_t ece_options;            /* the ECE options the QP uses (ibv_set_ece, else default) */
  int64_t device_index;            /* the fake device the QP lives on */
  uint64_t qp_state;               /* enum ibv_qp_state */
};

/* Counters of the QP with this number; 0 on success, -1 if no such QP exists. */
int fake_verbs_query_qp_stats(uint32_t qp_num, struct fake_verbs_qp_stats* out);

/* The numbers of the live QPs on a device (the application's and anyone else's, e.g. a shim's),
 * oldest first: up to `max` are stored; returns how many exist, or -1 for a bad index. */
int fake_verbs_list_qps(int device_index, uint32_t* qp_nums, int max);

struct fake_verbs_device_stats {
  uint64_t tx_messages;     /* messages sent from this device and delivered */
  uint64_t rx_messages;     /* messages delivered to this device */
  uint64_t dropped_packets; /* transport tries of this device's senders that were lost */
  uint64_t acks_lost;       /* acknowledgements to this device lost by fake_verbs_set_lose_acks */
};

int fake_verbs_query_device_stats(int device_index, struct fake_verbs_device_stats* out);

/* Back to defaults: all ports up (no events raised), no drop, no delay, all counters zero, the
 * GID tables as at start.
 * Existing verbs objects are untouched. Tests call it first to be independent of each other. */
void fake_verbs_reset(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_VERBS_CONTROL_H */
