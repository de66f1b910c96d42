/* The errors an application gets after a failover are the ones it would get without the shim,
   on the FAKE libibverbs (docs/fake_verbs.md). Two scenarios, one per program argument:

   rnr_after_failover (issue 19 item 12b): A (fake0) and B (fake2) are connected with rnr_retry 1
   and min_rnr_timer 12: a SEND that finds no receive at B is retried once, then fails with
   RNR_RETRY_EXC_ERR, and A's QP goes to the error state (later requests are flushed). One
   message each way proves the pair works; then fake0's port goes down and one more message
   A -> B proves the traffic moved (with the shim; without it the cut breaks it: the
   _noshim_fails test). Then A sends with no receive posted at B: A must get RNR_RETRY_EXC_ERR for
   it within the bound, as without the shim (the shim's standby must not retry RNR without end),
   B nothing; a SEND after it is flushed. --no-cut: the same without the cut (run without the
   shim: what the fake does, like a NIC).

   double_failure_heal (issue 19 item 1): after the failover, A's standby port (fake1) goes down
   too. A's SEND then fails (RETRY_EXC_ERR: its port knows the link is gone) and the next is
   flushed, as A's own QP would do. Both ports come back (the shim's re-arm retry at 50 ms, its
   port-stability wait at 0 via the environment): the QP must stay failed, as it would without
   the shim. For OBSERVE_MS after the shim has seen both ports come back, neither side may get a
   completion (a failback would replay A's failed SENDs: B would receive them, A would see their
   wr_ids again) and A's QP may not become protected again; a SEND after it is flushed too. B's
   QP must have been told (PairEnded) that A's failed for good.

   double_failure_grace (issue 19 item 6, issue 20 item 5): after the failover, A's standby port
   (fake1) goes down too, with A's SEND of block 3 posted there; A's QP then waits for a path
   (VERBS_FAILOVER_GRACE_MS) instead of failing. A's primary port (fake0) comes back within the
   grace: the traffic moves back to it with no error shown, the SEND completing once with SUCCESS
   and B receiving it once; then one message each way, and nothing more on either side.

   unreplayable_opcode (issue 19 item 8): on the healthy pair, A posts a LOCAL_INV (it names a key
   of fake0, which no standby device knows), which the fake refuses as a device without memory
   windows does. The post must return what the provider returns, as without the shim, and change
   nothing: A's QP stays protected (a refused request posted nothing the retransmit ring misses),
   and fake0's port going down then moves the traffic (one message A -> B after the cut). Without
   the shim the cut breaks it (the _noshim_fails test). The QP that does post such a request and
   becomes pass-through is covered by tests/unit/engine_unreplayable_ops_test.cc (the fake
   models no memory windows).

   Usage: error_after_failover rnr_after_failover [--no-cut] | double_failure_heal |
          double_failure_grace | unreplayable_opcode
   Output and exit status as exactly_once: "PASS scenario ..." 0, "FAIL: [...]" 1, "SETUP:" 3.
   Every wait is a bounded polling loop (each poll is a progress step of the fake). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/common/rc_connect.h"
#include "tests/common/scenario_report.h"
#include "tests/fake_verbs/fake_verbs_control.h"

#define BUF_SIZE 65536
#define MSG_LEN 128
#define WAIT_MS 10000
#define RNR_RETRY 1
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void (*fake_progress)(void);

struct end { /* one side: its device, buffer, CQ and QP */
  const char* name;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  uint8_t* buf;
  struct ibv_mr* mr;
  union ibv_gid gid;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
};

static void open_end(struct end* s, const char* name, const char* device) {
  s->name = name;
  s->ctx = open_device_named(device);
  s->pd = ibv_alloc_pd(s->ctx);
  s->mr = register_zeroed_buffer(s->pd, BUF_SIZE, ACCESS, &s->buf);
  s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  if (!s->cq || ibv_query_gid(s->ctx, 1, 1, &s->gid) != 0) setup_fail("CQ or GID on %s", device);
  struct ibv_qp_init_attr attr = {
      .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  s->qp = ibv_create_qp(s->pd, &attr);
  if (!s->qp) setup_fail("ibv_create_qp on %s", device);
}

/* As vf_test_rc_connect, with RNR_RETRY RNR retries instead of "without end" (7). */
static void connect_end(struct end* s, const struct end* peer) {
  if (vf_test_rc_to_init(s->qp, ACCESS)) setup_fail("%s to INIT", s->name);
  if (vf_test_rc_to_rtr(s->qp, peer->qp->qp_num, peer->gid, 1)) setup_fail("%s to RTR", s->name);
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = RNR_RETRY;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    setup_fail("%s to RTS", s->name);
}

static uint8_t* recv_slot(struct end* s, int i) { return s->buf + BUF_SIZE / 2 + (size_t)i * MSG_LEN; }

static void post_recv_slot(struct end* s, int i) {
  struct ibv_sge sge = {(uintptr_t)recv_slot(s, i), MSG_LEN, s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 0x5000u + (uint64_t)i, .sg_list = &sge, .num_sge = 1};
  struct ibv_recv_wr* bad = NULL;
  if (ibv_post_recv(s->qp, &wr, &bad) != 0) setup_fail("%s: ibv_post_recv", s->name);
}

/* A signaled SEND of block i (its bytes i * 7 + k); wr_id 0x7000 + i. 0 or the verb's error. */
static int post_send_block(struct end* s, int i) {
  uint8_t* src = s->buf + (size_t)i * MSG_LEN;
  for (int k = 0; k < MSG_LEN; ++k) src[k] = (uint8_t)(i * 7 + k);
  struct ibv_sge sge = {(uintptr_t)src, MSG_LEN, s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 0x7000u + (uint64_t)i, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr* bad = NULL;
  return ibv_post_send(s->qp, &wr, &bad);
}

/* One completion of s within WAIT_MS (1), or a failure (0). */
static int poll_one(struct end* s, struct ibv_wc* wc, const char* what) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (now_ms() < deadline) {
    const int n = ibv_poll_cq(s->cq, 1, wc);
    if (n < 0) {
      fail("%s: ibv_poll_cq returned %d", s->name, n);
      return 0;
    }
    if (n == 1) return 1;
    fake_progress();
  }
  fail("%s: no completion for %s within %d ms", s->name, what, WAIT_MS);
  return 0;
}

/* A's SEND of block i completes with `status`, and with success B receives it into slot j. */
static void expect_send(struct end* a, int i, enum ibv_wc_status status, const char* what) {
  struct ibv_wc wc;
  if (!poll_one(a, &wc, what)) return;
  if (wc.status != status || wc.wr_id != 0x7000u + (uint64_t)i || wc.qp_num != a->qp->qp_num ||
      (status == IBV_WC_SUCCESS && wc.opcode != IBV_WC_SEND))
    fail("%s: %s completed with status %s, wr_id %#llx, qp %u; expected %s, wr_id %#x, qp %u",
         a->name, what, ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id, wc.qp_num,
         ibv_wc_status_str(status), 0x7000u + (unsigned)i, a->qp->qp_num);
}

static void expect_received(struct end* b, int slot, int block) {
  struct ibv_wc wc;
  if (!poll_one(b, &wc, "a message")) return;
  int same = 1;
  for (int k = 0; k < MSG_LEN; ++k) same &= recv_slot(b, slot)[k] == (uint8_t)(block * 7 + k);
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
      wc.wr_id != 0x5000u + (uint64_t)slot || wc.byte_len != MSG_LEN || !same)
    fail("%s: receive completed with status %s, opcode %d, wr_id %#llx, %u bytes%s", b->name,
         ibv_wc_status_str(wc.status), (int)wc.opcode, (unsigned long long)wc.wr_id, wc.byte_len,
         same ? "" : ", not the bytes sent");
}

/* One message s -> peer (into the peer's slot `slot`), both completions checked. */
static void message(struct end* s, struct end* peer, int block, int slot, const char* what) {
  post_recv_slot(peer, slot);
  if (post_send_block(s, block) != 0) {
    fail("%s: ibv_post_send of %s refused", s->name, what);
    return;
  }
  expect_send(s, block, IBV_WC_SUCCESS, what);
  if (g_failures == 0) expect_received(peer, slot, block);
}

static struct end g_a, g_b;
static int (*g_port_down)(int);
static int (*g_port_up)(int);

/* Both ends open and connected, one message each way, fake0's port down, one message A -> B on
   the standby. */
static void connect_and_fail_over(int cut) {
  open_end(&g_a, "A", "fake0");
  open_end(&g_b, "B", "fake2");
  connect_end(&g_a, &g_b);
  connect_end(&g_b, &g_a);
  printf("QPN A=%u B=%u\n", g_a.qp->qp_num, g_b.qp->qp_num);
  message(&g_a, &g_b, 0, 0, "the first message A -> B");
  if (g_failures == 0) message(&g_b, &g_a, 1, 0, "the first message B -> A");
  if (g_failures == 0 && cut) {
    if (g_port_down(0) != 0) setup_fail("fake_verbs_port_down(0)");
    printf("cut: fake0 port down\n");
    message(&g_a, &g_b, 2, 1, "the message A -> B after the cut");
  }
}

/* A posts the SEND of `block`; it must complete with `status` (a refused post is the provider's
   choice for a QP in ERR, and fine). */
static void send_expecting(int block, enum ibv_wc_status status, const char* what) {
  if (post_send_block(&g_a, block) != 0) {
    printf("A: ibv_post_send of %s refused (the provider's choice)\n", what);
    return;
  }
  expect_send(&g_a, block, status, what);
}

static int rnr_after_failover(int no_cut) {
  connect_and_fail_over(!no_cut);
  if (g_failures == 0) {
    /* No receive at B: retried RNR_RETRY times, then the error, as the application asked. */
    if (post_send_block(&g_a, 3) != 0) fail("A: ibv_post_send of the SEND without a receive refused");
    expect_send(&g_a, 3, IBV_WC_RNR_RETRY_EXC_ERR, "the SEND B has no receive for");
  }
  /* The error moved A's QP to the error state: what A posts next is flushed. */
  if (g_failures == 0) send_expecting(4, IBV_WC_WR_FLUSH_ERR, "the SEND after the RNR error");
  struct ibv_wc wc;
  for (int i = 0; i < 8 && g_failures == 0; ++i) fake_progress();
  if (g_failures == 0 && ibv_poll_cq(g_b.cq, 1, &wc) != 0)
    fail("B: a completion (status %s, wr_id %#llx) for a message it had no receive for",
         ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
  if (g_failures) return 1;
  printf("PASS scenario rnr_after_failover%s: A got RNR_RETRY_EXC_ERR after %d RNR retr%s\n",
         no_cut ? " (no cut)" : "", RNR_RETRY, RNR_RETRY == 1 ? "y" : "ies");
  return 0;
}

#define OBSERVE_MS 1500
#define REARM_RETRY_MS 50

/* Waits (bounded) until the shim's port monitor has seen `device` change more than `before`
   times; without the shim there is nothing to wait for. (The monitor watches the primary
   ports, whose return is what would start a failback.) */
static void wait_port_seen(long (*changes)(const char*, int), const char* device, long before) {
  if (changes == NULL) return;
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (changes(device, 1) <= before) {
    if (now_ms() > deadline) {
      fail("the shim's port monitor did not see %s change within %d ms", device, WAIT_MS);
      return;
    }
    fake_progress();
  }
}

/* The shim's debug hooks (NULL without the shim). */
static int (*g_qp_protected)(uint32_t, char*, size_t);
static long (*g_port_changes)(const char*, int);

/* Both ends connected and failed over (fake0 down), with the shim's re-arm retried every
   REARM_RETRY_MS and its port monitor having seen fake0 go: 0, or 1 on a failure. */
static int fail_over_before_double_failure(void) {
  g_qp_protected = (int (*)(uint32_t, char*, size_t))dlsym(RTLD_DEFAULT,
                                                         "verbs_failover_debug_qp_protected");
  g_port_changes =
      (long (*)(const char*, int))dlsym(RTLD_DEFAULT, "verbs_failover_debug_port_changes");
  int (*set_rearm_retry_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_rearm_retry_ms");
  if (set_rearm_retry_ms != NULL && set_rearm_retry_ms(REARM_RETRY_MS) != 0)
    setup_fail("verbs_failover_debug_set_rearm_retry_ms(%d)", REARM_RETRY_MS);
  const long before_cut = g_port_changes ? g_port_changes("fake0", 1) : 0;
  connect_and_fail_over(1);
  if (g_failures) return 1;
  /* The monitor reads a port's state when it gets to the event: one that reads fake0 only after
     the heal would see no change at all, and a wait for the heal would never end. */
  wait_port_seen(g_port_changes, "fake0", before_cut);
  return g_failures ? 1 : 0;
}

static int double_failure_heal(void) {
  if (fail_over_before_double_failure()) return 1;
  post_recv_slot(&g_b, 2);
  post_recv_slot(&g_b, 3);
  if (g_port_down(1) != 0) setup_fail("fake_verbs_port_down(1)");
  printf("cut: fake1 (A's standby) port down too\n");
  send_expecting(3, IBV_WC_RETRY_EXC_ERR, "the SEND with both of A's ports down");
  if (g_failures == 0) send_expecting(4, IBV_WC_WR_FLUSH_ERR, "the SEND after that error");
  if (g_failures) return 1;
  const long seen0 = g_port_changes ? g_port_changes("fake0", 1) : 0;
  if (g_port_up(1) != 0 || g_port_up(0) != 0) setup_fail("fake_verbs_port_up");
  printf("heal: fake0 and fake1 ports up\n");
  wait_port_seen(g_port_changes, "fake0", seen0);
  /* Observation, not synchronisation: nothing may happen, and a failback (its re-arm retried
     every REARM_RETRY_MS) would happen well within it. */
  const uint64_t until = now_ms() + OBSERVE_MS;
  char reason[256] = "";
  while (g_failures == 0 && now_ms() < until) {
    struct ibv_wc wc;
    for (int side = 0; side < 2; ++side) {
      struct end* s = side == 0 ? &g_a : &g_b;
      const int n = ibv_poll_cq(s->cq, 1, &wc);
      if (n != 0)
        fail("%s: a completion after both paths failed and healed (n %d, status %s, wr_id "
             "%#llx): work the application saw fail was sent again",
             s->name, n, n > 0 ? ibv_wc_status_str(wc.status) : "-",
             n > 0 ? (unsigned long long)wc.wr_id : 0ull);
    }
    if (g_qp_protected != NULL && g_qp_protected(g_a.qp->qp_num, reason, sizeof reason) == 1)
      fail("A's QP is protected again after the application saw it fail");
    fake_progress();
  }
  if (g_failures == 0) send_expecting(5, IBV_WC_WR_FLUSH_ERR, "the SEND after the heal");
  if (g_failures == 0 && g_qp_protected != NULL) {
    g_qp_protected(g_a.qp->qp_num, reason, sizeof reason);
    if (strstr(reason, "no path is left") == NULL)
      fail("A's QP is unprotected for the wrong reason: %s", reason);
    /* B was told (PairEnded): it neither waits for a switch nor asks for re-arms. */
    char peer_reason[256] = "";
    if (g_qp_protected(g_b.qp->qp_num, peer_reason, sizeof peer_reason) != 0 ||
        strstr(peer_reason, "the peer's QP failed for good") == NULL)
      fail("B's QP was not told that A's QP failed for good: %s", peer_reason);
  }
  if (g_failures) return 1;
  printf("PASS scenario double_failure_heal: A's QP stayed failed through the heal (%s)\n",
         g_qp_protected ? reason : "no shim");
  return 0;
}

/* Waits (bounded) until the shim says A's QP waits for a path; without the shim there is none. */
static void wait_for_path_wait(void) {
  if (g_qp_protected == NULL) return;
  const uint64_t deadline = now_ms() + WAIT_MS;
  char reason[256] = "";
  for (;;) {
    g_qp_protected(g_a.qp->qp_num, reason, sizeof reason);
    if (strstr(reason, "waiting for a path") != NULL) return;
    if (now_ms() > deadline) {
      fail("A's QP does not wait for a path within %d ms after both its ports went down: %s",
           WAIT_MS, reason);
      return;
    }
    struct ibv_wc wc;
    const int n = ibv_poll_cq(g_a.cq, 1, &wc);
    if (n != 0) {
      fail("A: a completion while both its ports are down (n %d, status %s, wr_id %#llx): the "
           "shim showed the failure instead of waiting for a path",
           n, n > 0 ? ibv_wc_status_str(wc.status) : "-", n > 0 ? (unsigned long long)wc.wr_id : 0ull);
      return;
    }
    fake_progress();
  }
}

static int double_failure_grace(void) {
  if (fail_over_before_double_failure()) return 1;
  post_recv_slot(&g_b, 2);
  if (g_port_down(1) != 0) setup_fail("fake_verbs_port_down(1)");
  printf("cut: fake1 (A's standby) port down too\n");
  if (post_send_block(&g_a, 3) != 0) fail("A: ibv_post_send of the SEND with both ports down refused");
  if (g_failures == 0) wait_for_path_wait();
  if (g_failures) return 1;
  if (g_port_up(0) != 0) setup_fail("fake_verbs_port_up(0)");
  printf("heal: fake0 (A's primary) port up within the grace\n");
  expect_send(&g_a, 3, IBV_WC_SUCCESS, "the SEND posted with both of A's ports down");
  if (g_failures == 0) expect_received(&g_b, 2, 3);
  if (g_failures == 0) message(&g_a, &g_b, 4, 3, "a message A -> B after the heal");
  if (g_failures == 0) message(&g_b, &g_a, 5, 1, "a message B -> A after the heal");
  for (int i = 0; i < 64 && g_failures == 0; ++i) {
    struct ibv_wc wc;
    for (int side = 0; side < 2; ++side) {
      struct end* e = side == 0 ? &g_a : &g_b;
      const int n = ibv_poll_cq(e->cq, 1, &wc);
      if (n != 0)
        fail("%s: an extra completion (n %d, status %s, wr_id %#llx)", e->name, n,
             n > 0 ? ibv_wc_status_str(wc.status) : "-", n > 0 ? (unsigned long long)wc.wr_id : 0ull);
    }
    fake_progress();
  }
  if (g_failures) return 1;
  printf("PASS scenario double_failure_grace: the primary came back within the grace and took "
         "the traffic, nothing lost or repeated\n");
  return 0;
}

static int unreplayable_opcode(void) {
  int (*qp_protected)(uint32_t, char*, size_t) = (int (*)(uint32_t, char*, size_t))dlsym(
      RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  connect_and_fail_over(0);
  if (g_failures) return 1;
  struct ibv_send_wr wr = {.wr_id = 0x9000u, .opcode = IBV_WR_LOCAL_INV,
                           .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = g_a.mr->rkey};
  struct ibv_send_wr* bad = NULL;
  const int result = ibv_post_send(g_a.qp, &wr, &bad);
  printf("A: ibv_post_send(LOCAL_INV) = %d\n", result);
  if (result != EINVAL || bad != &wr)
    fail("A: ibv_post_send(LOCAL_INV) returned %d (bad_wr %s); the fake refuses it with EINVAL",
         result, bad == &wr ? "that request" : "not that request");
  if (qp_protected != NULL) {
    /* Whatever the engine does, it does on its next pass: give it a few (observation only). */
    for (int i = 0; i < 64; ++i) fake_progress();
    char reason[512] = "";
    if (qp_protected(g_a.qp->qp_num, reason, sizeof reason) != 1)
      fail("A's QP lost its protection over a request the provider refused: %s", reason);
  }
  if (g_failures) return 1;
  if (g_port_down(0) != 0) setup_fail("fake_verbs_port_down(0)");
  printf("cut: fake0 port down\n");
  message(&g_a, &g_b, 2, 1, "the message A -> B after the cut");
  if (g_failures == 0) message(&g_b, &g_a, 3, 1, "a message B -> A after the cut");
  if (g_failures) return 1;
  printf("PASS scenario unreplayable_opcode\n");
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const int no_cut = argc == 3 && strcmp(argv[2], "--no-cut") == 0;
  if (argc >= 2) g_scenario = argv[1];
  const int rnr = argc >= 2 && strcmp(argv[1], "rnr_after_failover") == 0 && (argc == 2 || no_cut);
  const int double_failure = argc == 2 && strcmp(argv[1], "double_failure_heal") == 0;
  const int grace = argc == 2 && strcmp(argv[1], "double_failure_grace") == 0;
  const int unreplayable = argc == 2 && strcmp(argv[1], "unreplayable_opcode") == 0;
  if (!rnr && !double_failure && !grace && !unreplayable) {
    fprintf(stderr,
            "usage: %s rnr_after_failover [--no-cut] | double_failure_heal | "
            "double_failure_grace | unreplayable_opcode\n",
            argv[0]);
    return 2;
  }
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  g_port_down = (int (*)(int))fake_sym("fake_verbs_port_down");
  g_port_up = (int (*)(int))fake_sym("fake_verbs_port_up");
  const int status = rnr            ? rnr_after_failover(no_cut)
                     : double_failure ? double_failure_heal()
                     : grace          ? double_failure_grace()
                                      : unreplayable_opcode();
  if (status != 0) printf("FAIL: scenario %s: %d failure(s)\n", g_scenario, g_failures);
  return status;
}
