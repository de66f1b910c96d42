/* The scenarios of vf_exactly_once that go on after the failover: a failback with work in flight
   on the standby, the standby's port blinking (the shim's view of each QP's protection), and a
   silent cut that is repaired. Their rows are in the table of exactly_once_cuts.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "tests/failover/exactly_once.h"

#define REARM_RETRY_MS 600000 /* standby_blink: the shim's re-arm retry, far beyond any wait */

/* Rounds of traffic until the primary (fake0, whose counters were f0 before its port came back)
   carries some again (the failback is the shim's to time, on its own thread). Each round consumes
   a receive on each side, so rounds are spread over the time bound (a round costs microseconds; a
   busy machine may not run the shim's thread for milliseconds): between rounds the fake makes
   progress and this thread yields. */
static void wait_primary_carries(const struct fake_verbs_device_stats* f0) {
  const long long deadline = now_ms() + g_timeout_ms;
  const long long spacing_ms = g_timeout_ms / 40;
  struct fake_verbs_device_stats now;
  for (int round = 0;; ++round) {
    for (const long long next = now_ms() + (round > 0 ? spacing_ms : 0); now_ms() < next;) {
      fv.progress();
      fv.dev_stats(0, &now);
      if (now.tx_messages > f0->tx_messages) break;
      sched_yield();
    }
    post_op(&g_a, IBV_WR_SEND_WITH_IMM, 16, SIG, 0xfb10);
    post_op(&g_b, IBV_WR_RDMA_WRITE_WITH_IMM, 16, SIG, 0xfb11);
    if (wait_for(all_done, POLL_BOTH, "traffic after the port came back") != 0) return;
    fv.dev_stats(0, &now);
    if (now.tx_messages > f0->tx_messages) break;
    if (now_ms() > deadline || recvs_left(&g_b) < 4 || recvs_left(&g_a) < 4) {
      fail("the primary (fake0) carried no traffic after its port came back (no failback)");
      return;
    }
  }
}

/* Failback with work in flight on the standby: after the failover, WRs held on fake1's wire
   (delay) when fake0 comes back; the shim switches back (docs/design.md §5 "Failback") and
   whatever the standby had not delivered must be carried by the primary exactly once. */
void scenario_failback_in_flight(void) {
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_SEND, 10, SIG, 0);
  post_op(&g_b, IBV_WR_SEND, 10, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "traffic after the cut") != 0) return;
  struct fake_verbs_device_stats f0, f1, f1b;
  fv.dev_stats(1, &f1);
  fv.set_delay(1, 3000); /* held on the standby's wire for 3000 progress steps */
  begin_batch(&g_a);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 1200, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0xfb01);
  post_op(&g_a, IBV_WR_RDMA_READ, 64, SIG, 0);
  end_batch(&g_a);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 50, SIG, 0xfb02);
  stream(1); /* --srq: the second pair has work held on the standby too */
  fv.dev_stats(1, &f1b);
  if (f1b.tx_messages != f1.tx_messages) setup_fail("the standby's WRs were not held");
  printf("EXPECT failback\n");
  fv.dev_stats(0, &f0);
  if (fv.port_up(0) != 0) setup_fail("fake_verbs_port_up(0)");
  if (wait_for(all_done, POLL_BOTH, "the WRs in flight on the standby at the failback") != 0)
    return;
  fv.set_delay(1, 0);
  wait_primary_carries(&f0);
}

/* The primary's GID moves while its port is down (issue 20 item 4): fake0's address is removed
   and added again at another slot (index 1 -> 3), as the kernel does when another address took
   the old slot or a QP still held it. The re-armed primary must use the index its GID has now:
   with the old one fake0 refuses the RTR (ENODATA, the slot is empty) and the pair never fails
   back. */
void scenario_failback_gid_moved(void) {
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_SEND, 10, SIG, 0);
  post_op(&g_b, IBV_WR_RDMA_WRITE_WITH_IMM, 40, SIG, 0x9d01);
  if (wait_for(all_done, POLL_BOTH, "traffic after the cut") != 0) return;
  printf("gid: fake0's GID moves from index 1 to 3 while its port is down\n");
  if (fv.move_gid(0, 1, 3) != 0) setup_fail("fake_verbs_move_gid(0, 1, 3)");
  g_gid_changed_on = 0;
  printf("EXPECT failback\n");
  struct fake_verbs_device_stats f0;
  fv.dev_stats(0, &f0);
  if (fv.port_up(0) != 0) setup_fail("fake_verbs_port_up(0)");
  wait_primary_carries(&f0);
}

/* ------------------------------------------------------------------ standby_blink */

/* The shim's view of a QP (verbs_failover_debug_qp_protected): 1 protected, 0 not, -1 unknown.
   NULL without the shim (the noshim twin): the blinks are then not observed, only survived. */
typedef int (*qp_protected_fn)(uint32_t qpn, char* reason, size_t reason_size);
static qp_protected_fn g_qp_protected;

struct protection_want {
  struct side* side;
  int state;          /* 1 protected, 0 not */
  const char* reason; /* with state 0: a part of the reason it must give */
};

static int protection_holds(const struct protection_want* w, char* reason, size_t size) {
  reason[0] = '\0';
  const int state = g_qp_protected(w->side->qp->qp_num, reason, size);
  return state == w->state && (w->state != 0 || strstr(reason, w->reason) != NULL);
}

/* Polls (progress steps) until the shim says of every listed QP what is wanted; bounded. */
static int wait_protection(const struct protection_want* want, int n, const char* what) {
  if (g_qp_protected == NULL) return 0;
  const long long deadline = now_ms() + g_timeout_ms;
  char reason[256];
  for (;;) {
    int held = 0;
    if (poll_side(&g_a) + poll_side(&g_b) == 0) sched_yield();
    for (int i = 0; i < n; ++i) held += protection_holds(&want[i], reason, sizeof reason);
    if (held == n) {
      printf("shim: %s\n", what);
      return 0;
    }
    if (now_ms() > deadline) break;
  }
  for (int i = 0; i < n; ++i) {
    if (protection_holds(&want[i], reason, sizeof reason)) continue;
    const int state = g_qp_protected(want[i].side->qp->qp_num, reason, sizeof reason);
    fail("timeout (%d ms) waiting until %s: the shim says QP %s is %s (%s); wanted %s %s",
         g_timeout_ms, what, want[i].side->name,
         state == 1 ? "protected" : state == 0 ? "unprotected" : "unknown to it", reason,
         want[i].state ? "protected" : "unprotected, for a reason naming",
         want[i].state ? "" : want[i].reason);
  }
  return -1;
}

/* The standby's port goes down and comes back while the primary carries the traffic, on each
   side in turn (fake1 holds A's standby, fake3 B's). While it is down both shims must report
   both QPs unprotected: the side whose own ports are all up learns it from its peer (PathStatus);
   without that it would count on a standby that cannot carry anything. Once it is up both QPs
   must be protected again: the path is re-armed whichever of the two ends asks for re-arming (the
   two blinks give each role to the side whose port blinked once), at once, not at the shim's
   re-arm retry (set to 10 minutes here). Traffic runs, and is checked, all along. Then fake0
   dies: the failover must go over the re-armed standby. */
void scenario_standby_blink(void) {
  g_qp_protected = (qp_protected_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  int (*set_rearm_retry_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_rearm_retry_ms");
  if (g_qp_protected == NULL || set_rearm_retry_ms == NULL) {
    g_qp_protected = NULL;
    printf("no shim: the standby blinks are not observed\n");
  } else if (set_rearm_retry_ms(REARM_RETRY_MS) != 0) {
    setup_fail("verbs_failover_debug_set_rearm_retry_ms(%d)", REARM_RETRY_MS);
  }
  setup(48, 48);
  warmup();
  const struct protection_want all_protected[2] = {{&g_a, 1, NULL}, {&g_b, 1, NULL}};
  if (wait_protection(all_protected, 2, "A and B are protected") != 0) return;
  static const struct {
    int device;
    struct side* owner;
    const char* own_reason;
  } kBlinks[2] = {{1, &g_a, "standby path's port fake1/1 is down"},
                  {3, &g_b, "standby path's port fake3/1 is down"}};
  for (int i = 0; i < 2; ++i) {
    const int device = kBlinks[i].device;
    struct side* owner = kBlinks[i].owner;
    printf("blink: fake%d (%s's standby) port down\n", device, owner->name);
    if (fv.port_down(device) != 0) setup_fail("fake_verbs_port_down(%d)", device);
    const struct protection_want lost[2] = {
        {owner, 0, kBlinks[i].own_reason},
        {owner->peer, 0, "the peer's end of its standby path failed"}};
    if (wait_protection(lost, 2, "both QPs say their standby is lost") != 0) return;
    post_op(&g_a, IBV_WR_RDMA_WRITE, 700, 0, 0);
    post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 120, SIG, 0x5b01u + (unsigned)i);
    stream(1);
    post_op(&g_b, IBV_WR_SEND, 60, SIG, 0);
    if (wait_for(all_done, POLL_BOTH, "traffic on the primary while a standby port is down") != 0)
      return;
    printf("blink: fake%d port up\n", device);
    if (fv.port_up(device) != 0) setup_fail("fake_verbs_port_up(%d)", device);
    /* The side that asks for re-arms asked while the port was down and got no answer; its retry
       is set far beyond this wait, so the path must come back because the answering side said
       its port is back (or, when the asker's own port blinked, because it asked). */
    if (wait_protection(all_protected, 2, "A and B are protected again") != 0) return;
  }
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 900, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0x5bf0);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 150, SIG, 0x5bf1);
  wait_for(all_done, POLL_BOTH, "the traffic posted after the cut");
}

/* A black hole on the idle standby (issue 20 item 1, standby_dead): fake1, A's standby, drops
   every packet while fake0 carries the traffic; no port changes, so only the shims' probes of
   the idle standby (VERBS_FAILOVER_PROBE_MS, 20 ms here) can tell. Both QPs must be reported
   unprotected, the traffic on the primary going on unharmed and checked; once fake1 is repaired
   and the hold (300 ms here) is over, both must be protected again. Then fake0 dies: the
   failover must go over the re-armed standby. Without the probes the QPs stay "protected" and
   the first wait times out. */
void scenario_standby_silent(void) {
  g_qp_protected = (qp_protected_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  int (*set_hold_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_hold_down_ms");
  if (g_qp_protected == NULL || set_hold_ms == NULL) {
    g_qp_protected = NULL;
    printf("no shim: the probes are not observed\n");
  } else if (set_hold_ms(300) != 0) {
    setup_fail("verbs_failover_debug_set_hold_down_ms(300)");
  }
  setup(48, 48);
  warmup();
  const struct protection_want all_protected[2] = {{&g_a, 1, NULL}, {&g_b, 1, NULL}};
  if (wait_protection(all_protected, 2, "A and B are protected") != 0) return;
  printf("black hole: fake1 (A's standby) drops every packet\n");
  if (fv.set_drop(1, 1) != 0) setup_fail("fake_verbs_set_drop(1, 1)");
  const struct protection_want lost[2] = {{&g_a, 0, "standby path"}, {&g_b, 0, "standby path"}};
  if (wait_protection(lost, 2, "both QPs say their standby failed") != 0) return;
  post_op(&g_a, IBV_WR_RDMA_WRITE, 700, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 120, SIG, 0x5d01);
  post_op(&g_b, IBV_WR_SEND, 60, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "traffic on the primary while the standby is a black hole") !=
      0)
    return;
  printf("repair: fake1 stops dropping\n");
  if (fv.set_drop(1, 0) != 0) setup_fail("fake_verbs_set_drop(1, 0)");
  if (wait_protection(all_protected, 2, "A and B are protected again") != 0) return;
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 900, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0x5df0);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 150, SIG, 0x5df1);
  wait_for(all_done, POLL_BOTH, "the traffic posted after the cut");
}

/* A silent cut that is repaired: fake0 drops everything (no port event), the shims switch on
   RETRY_EXC and hold fake0's path down (here for 300 ms instead of 10 s) and say both QPs are
   unprotected meanwhile; fake0 is repaired; once the hold ends the path is re-armed, both QPs are
   protected again and fail back; traffic then runs on it. A hold that never ended, or a re-arm
   that never came, leaves the QPs unprotected past the wait. */
void scenario_silent_cut_repaired(void) {
  g_qp_protected = (qp_protected_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  int (*set_hold_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_hold_down_ms");
  if (g_qp_protected == NULL || set_hold_ms == NULL) {
    g_qp_protected = NULL;
    printf("no shim: the hold-down is not observed\n");
  } else if (set_hold_ms(300) != 0) {
    setup_fail("verbs_failover_debug_set_hold_down_ms(300)");
  }
  g_silent_cut = 1;
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 600, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 90, SIG, 0x7a01);
  post_op(&g_b, IBV_WR_SEND, 70, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "the traffic posted after the silent cut") != 0) return;
  const struct protection_want held[2] = {{&g_a, 0, "held down"}, {&g_b, 0, "held down"}};
  if (wait_protection(held, 2, "both QPs say their primary is held down") != 0) return;
  printf("repair: fake0 stops dropping\n");
  if (fv.set_drop(0, 0) != 0) setup_fail("fake_verbs_set_drop(0, 0)");
  const struct protection_want back[2] = {{&g_a, 1, NULL}, {&g_b, 1, NULL}};
  if (wait_protection(back, 2, "A and B are protected again") != 0) return;
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 110, SIG, 0x7a02);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 50, SIG, 0x7a03);
  wait_for(all_done, POLL_BOTH, "the traffic after the repair");
}
