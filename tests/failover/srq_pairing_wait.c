/* An SRQ's move waits for a QP on it whose pairing is still in flight (docs/design.md §5i), on
   the FAKE libibverbs (docs/fake_verbs.md).

   A1 and A3 take their receives from one SRQ on fake0. A1's peer B1 (fake2) exists, so the pair
   is protected at once. A3's peer B3 does not exist yet: A3 is connected towards the QP number
   B3 will get, so the shim finds no such QP in the process and looks for the peer's shim over
   the network: A3's pairing is in flight, and A3 is unprotected but healthy (its path, fake0, is
   up). Then fake2's port goes down: B1 fails over and asks A1 to follow, and A1 can only move
   with its SRQ. Moving the SRQ's receives without A3 would fail A3 (its receives gone), so the
   shim must wait: the program waits for the shim's log line saying so, only then creates B3
   and connects it to A3 (their pairing completes at B3's RTR), and the SRQ moves with both QPs.
   B3 is switched along before the program moves it to RTS (it waits for that): its RTS must
   still succeed.

   Checked from the application's side: A3 -> B3 SENDs and one SEND each way between A1 and B1
   (B1 -> A1 takes an SRQ receive) complete successfully, in order, with their payloads; every
   QP reads RTS; no async event reaches the application. The stats of A3 and B3 (a failover each:
   they moved with the SRQ) are checked by run_exactly_once.sh from the "QPN" line.

   Usage: srq_pairing_wait srq_pairing_wait
   Output and exit status as exactly_once: "PASS scenario ..." 0, "FAIL: [...]" 1, "SETUP:" 3.
   Every wait is a bounded polling loop (each poll is a progress step of the fake). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
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
#define MSG_LEN 256
#define A3_MESSAGES 4
/* Buffers never shared by two messages: on host A, A3 sends from blocks 0.. and A1 from block
   A1_SOURCE; on host B, B1 receives into slot 0 and B3 into slots B3_SLOTS.. */
#define A1_SOURCE 8
#define B3_SLOTS 8
#define WAIT_MS 10000
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define WAIT_LINE "waits for the pairing of"

static void (*fake_progress)(void);

struct host { /* one side's device: context, PD, buffer, MR */
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  uint8_t* buf;
  struct ibv_mr* mr;
  union ibv_gid gid;
};

struct qp {
  const char* name;
  struct host* host;
  struct ibv_cq* cq; /* send and receive completions */
  struct ibv_qp* qp;
};

static struct ibv_context* open_fake(const char* want) {
  struct ibv_context* ctx = open_device_named(want);
  /* non-blocking async events: a pending one is a failure, none is the normal case */
  const int flags = fcntl(ctx->async_fd, F_GETFL);
  if (fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) != 0) setup_fail("async fd");
  return ctx;
}

static void open_host(struct host* h, const char* device) {
  h->ctx = open_fake(device);
  h->pd = ibv_alloc_pd(h->ctx);
  if (!h->pd) setup_fail("ibv_alloc_pd on %s", device);
  if (posix_memalign((void**)&h->buf, 4096, BUF_SIZE) != 0) setup_fail("memory");
  memset(h->buf, 0, BUF_SIZE);
  h->mr = ibv_reg_mr(h->pd, h->buf, BUF_SIZE, ACCESS);
  if (!h->mr) setup_fail("ibv_reg_mr on %s", device);
  if (ibv_query_gid(h->ctx, 1, 1, &h->gid) != 0) setup_fail("ibv_query_gid on %s", device);
}

static void create_qp(struct qp* q, struct host* h, struct ibv_srq* srq, const char* name) {
  q->name = name;
  q->host = h;
  q->cq = ibv_create_cq(h->ctx, 64, NULL, NULL, 0);
  if (!q->cq) setup_fail("ibv_create_cq for %s", name);
  struct ibv_qp_init_attr attr = {.send_cq = q->cq,
                                  .recv_cq = q->cq,
                                  .srq = srq,
                                  .cap = {.max_send_wr = 16,
                                          .max_recv_wr = srq ? 0 : 16,
                                          .max_send_sge = 1,
                                          .max_recv_sge = srq ? 0 : 1},
                                  .qp_type = IBV_QPT_RC};
  q->qp = ibv_create_qp(h->pd, &attr);
  if (!q->qp) setup_fail("ibv_create_qp for %s", name);
}

static void connect_qp(struct qp* q, uint32_t dest_qpn, union ibv_gid dgid) {
  const int step = vf_test_rc_connect(q->qp, dest_qpn, dgid, 1, ACCESS);
  if (step != 0) setup_fail("connecting %s (step %d)", q->name, step);
}

/* B3 to INIT and RTR (it pairs with A3 there), then, with the shim, wait until the shim has
   switched it along with A's SRQ (its own QP leaves RTR: the fake's state, read without a
   progress step), and only then to RTS: an application whose QP the peer switched between its
   RTR and its RTS must still get its RTS (the shim records it for the QP's re-arm). Same
   steps as vf_test_rc_connect. */
static void connect_b3(struct qp* q, uint32_t dest_qpn, union ibv_gid dgid, int with_shim) {
  if (vf_test_rc_to_init(q->qp, ACCESS)) setup_fail("B3 to INIT");
  if (vf_test_rc_to_rtr(q->qp, dest_qpn, dgid, 1)) setup_fail("B3 to RTR");
  if (with_shim) {
    int (*qp_stats)(uint32_t, struct fake_verbs_qp_stats*) =
        (int (*)(uint32_t, struct fake_verbs_qp_stats*))fake_sym("fake_verbs_query_qp_stats");
    const uint64_t deadline = now_ms() + WAIT_MS;
    struct fake_verbs_qp_stats st;
    memset(&st, 0, sizeof st);
    /* The switch moves it to ERR, and right after to RESET and INIT, ready to be re-armed. */
    while (now_ms() < deadline && qp_stats(q->qp->qp_num, &st) == 0 && st.qp_state == IBV_QPS_RTR)
      sched_yield();
    if (st.qp_state == IBV_QPS_RTR)
      fail("B3 was not switched along with A3 within %d ms (its QP is in state %llu)", WAIT_MS,
           (unsigned long long)st.qp_state);
  }
  const int rc = vf_test_rc_to_rts(q->qp);
  if (rc != 0) fail("B3: ibv_modify_qp to RTS failed (%s)", strerror(rc));
}

/* Receive slot i of a host's buffer (the upper half; sources are in the lower half). */
static uint8_t* slot(struct host* h, int i) { return h->buf + BUF_SIZE / 2 + (size_t)i * MSG_LEN; }

static void post_recv_to(struct qp* q, struct ibv_srq* srq, int i) {
  struct ibv_sge sge = {(uintptr_t)slot(q->host, i), MSG_LEN, q->host->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 0x5000u + (uint64_t)i, .sg_list = &sge, .num_sge = 1};
  struct ibv_recv_wr* bad = NULL;
  const int rc = srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(q->qp, &wr, &bad);
  if (rc != 0) setup_fail("posting receive %d for %s", i, q->name);
}

static void fill(uint8_t* p, uint32_t seed) {
  for (int i = 0; i < MSG_LEN; ++i) p[i] = (uint8_t)(seed * 31u + (uint32_t)i * 7u);
}

/* A signaled SEND of source block `i` (pattern `seed`); 0 or the verb's error. */
static int post_send_msg(struct qp* q, int i, uint32_t seed) {
  uint8_t* src = q->host->buf + (size_t)i * MSG_LEN;
  fill(src, seed);
  struct ibv_sge sge = {(uintptr_t)src, MSG_LEN, q->host->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 0x7000u + (uint64_t)i, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr* bad = NULL;
  return ibv_post_send(q->qp, &wr, &bad);
}

/* Polls q's CQ until one completion arrives or WAIT_MS pass; 1 with *wc, 0 on timeout. */
static int poll_one(struct qp* q, struct ibv_wc* wc) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (now_ms() < deadline) {
    const int n = ibv_poll_cq(q->cq, 1, wc);
    if (n < 0) {
      fail("ibv_poll_cq on %s returned %d", q->name, n);
      return 0;
    }
    if (n == 1) return 1;
    fake_progress();
  }
  fail("%s: no completion within %d ms", q->name, WAIT_MS);
  return 0;
}

static void expect_send_done(struct qp* q, int i) {
  struct ibv_wc wc;
  if (!poll_one(q, &wc)) return;
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND || wc.wr_id != 0x7000u + (uint64_t)i ||
      wc.qp_num != q->qp->qp_num)
    fail("%s: send %d completed with status %s opcode %d wr_id %#llx qp %u", q->name, i,
         ibv_wc_status_str(wc.status), (int)wc.opcode, (unsigned long long)wc.wr_id, wc.qp_num);
}

static void expect_received(struct qp* q, int slot_index, uint32_t seed) {
  struct ibv_wc wc;
  if (!poll_one(q, &wc)) return;
  uint8_t want[MSG_LEN];
  fill(want, seed);
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
      wc.wr_id != 0x5000u + (uint64_t)slot_index || wc.byte_len != MSG_LEN ||
      wc.qp_num != q->qp->qp_num)
    fail("%s: receive completed with status %s opcode %d wr_id %#llx len %u qp %u (want slot %d)",
         q->name, ibv_wc_status_str(wc.status), (int)wc.opcode, (unsigned long long)wc.wr_id,
         wc.byte_len, wc.qp_num, slot_index);
  else if (memcmp(slot(q->host, slot_index), want, MSG_LEN) != 0)
    fail("%s: the message in slot %d is not what was sent", q->name, slot_index);
}

/* q's send of block `source` and its receive into slot `slot_index` (pattern `seed`) both
   complete, in either order (one CQ). */
static void expect_send_and_receive(struct qp* q, int source, int slot_index, uint32_t seed) {
  int sends = 0, receives = 0;
  for (int n = 0; n < 2; ++n) {
    struct ibv_wc wc;
    if (!poll_one(q, &wc)) return;
    if (wc.status != IBV_WC_SUCCESS || wc.qp_num != q->qp->qp_num) {
      fail("%s: completion with status %s on qp %u", q->name, ibv_wc_status_str(wc.status),
           wc.qp_num);
    } else if (wc.opcode == IBV_WC_SEND) {
      ++sends;
      if (wc.wr_id != 0x7000u + (uint64_t)source)
        fail("%s: its send completed as wr_id %#llx", q->name, (unsigned long long)wc.wr_id);
    } else if (wc.opcode == IBV_WC_RECV) {
      ++receives;
      uint8_t want[MSG_LEN];
      fill(want, seed);
      if (wc.wr_id != 0x5000u + (uint64_t)slot_index || wc.byte_len != MSG_LEN)
        fail("%s: the message took receive %#llx (%u bytes), not slot %d", q->name,
             (unsigned long long)wc.wr_id, wc.byte_len, slot_index);
      else if (memcmp(slot(q->host, slot_index), want, MSG_LEN) != 0)
        fail("%s: the message in slot %d is not what was sent", q->name, slot_index);
    } else {
      fail("%s: completion with opcode %d", q->name, (int)wc.opcode);
    }
  }
  if (sends != 1 || receives != 1)
    fail("%s: %d send and %d receive completion(s), not one each", q->name, sends, receives);
}

/* Polls the shim's log (VERBS_FAILOVER_LOG_FILE) until `line` appears; 1 if it did. */
static int wait_for_log(const char* path, const char* line) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  static char text[1 << 20];
  while (now_ms() < deadline) {
    FILE* f = fopen(path, "r");
    if (f) {
      const size_t n = fread(text, 1, sizeof text - 1, f);
      fclose(f);
      text[n] = '\0';
      if (strstr(text, line)) return 1;
    }
    fake_progress();
  }
  return 0;
}

static void check_rts_and_events(struct qp* q) {
  struct ibv_qp_attr attr;
  struct ibv_qp_init_attr init;
  if (ibv_query_qp(q->qp, &attr, IBV_QP_STATE, &init) != 0 || attr.qp_state != IBV_QPS_RTS ||
      q->qp->state != IBV_QPS_RTS)
    fail("%s: QP state %d (qp->state %d), not RTS", q->name, (int)attr.qp_state,
         (int)q->qp->state);
  struct ibv_async_event event;
  if (ibv_get_async_event(q->host->ctx, &event) == 0) {
    fail("%s's context got async event %s", q->name, ibv_event_type_str(event.event_type));
    ibv_ack_async_event(&event);
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2 || strcmp(argv[1], "srq_pairing_wait") != 0) {
    fprintf(stderr, "usage: %s srq_pairing_wait\n", argv[0]);
    return 2;
  }
  g_scenario = "srq_pairing_wait";
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  int (*port_down)(int) = (int (*)(int))fake_sym("fake_verbs_port_down");
  /* With the shim, its log tells when the SRQ's move starts waiting (run_exactly_once.sh sets
     it); without the shim there is nothing to wait for, and the cut must break the traffic. */
  const char* shim_log = getenv("LD_PRELOAD") ? getenv("VERBS_FAILOVER_LOG_FILE") : NULL;

  struct host a, b;
  open_host(&a, "fake0");
  open_host(&b, "fake2");
  struct ibv_srq_init_attr sattr = {.attr = {.max_wr = 64, .max_sge = 1}};
  struct ibv_srq* srq = ibv_create_srq(a.pd, &sattr);
  if (!srq) setup_fail("ibv_create_srq");
  struct qp a1, a3, b1, b3;
  create_qp(&a1, &a, srq, "A1");
  create_qp(&b1, &b, NULL, "B1");
  connect_qp(&a1, b1.qp->qp_num, b.gid);
  connect_qp(&b1, a1.qp->qp_num, a.gid);
  for (int i = 0; i < 2; ++i) post_recv_to(&a1, srq, i); /* B1 -> A1 after the move */
  post_recv_to(&b1, NULL, 0);                             /* A1 -> B1 after the move */

  /* The QP number B3 will get: the fake numbers QPs in creation order, across devices, and the
     shim gives every protected QP a standby, so a probe QP shows where numbering stands. */
  struct qp probe;
  create_qp(&probe, &b, NULL, "probe");
  const uint32_t probe_qpn = probe.qp->qp_num;
  if (ibv_destroy_qp(probe.qp) != 0 || ibv_destroy_cq(probe.cq) != 0) setup_fail("probe");
  create_qp(&a3, &a, srq, "A3");
  const uint32_t b3_expected = a3.qp->qp_num + (a3.qp->qp_num - probe_qpn);
  connect_qp(&a3, b3_expected, b.gid); /* nobody there yet: A3's pairing stays in flight */

  if (port_down(2) != 0) setup_fail("fake_verbs_port_down(2)");
  printf("cut: fake2 port down (B1 fails over, A1 must follow with A's SRQ)\n");
  if (shim_log && !wait_for_log(shim_log, WAIT_LINE)) {
    fail("the shim never said the SRQ's move waits for A3's pairing (\"%s\" in %s)", WAIT_LINE,
         shim_log);
  }

  create_qp(&b3, &b, NULL, "B3");
  if (b3.qp->qp_num != b3_expected)
    setup_fail("B3 got QP number %u, not the %u A3 was connected to", b3.qp->qp_num, b3_expected);
  connect_b3(&b3, a3.qp->qp_num, a.gid, shim_log != NULL);
  for (int i = 0; i < A3_MESSAGES; ++i) post_recv_to(&b3, NULL, B3_SLOTS + i);
  printf("QPN A=%u B=%u\n", a3.qp->qp_num, b3.qp->qp_num);
  printf("QPN A1=%u B1=%u\n", a1.qp->qp_num, b1.qp->qp_num);

  for (int i = 0; i < A3_MESSAGES; ++i)
    if (post_send_msg(&a3, i, 300u + (uint32_t)i) != 0) fail("A3: post_send %d refused", i);
  if (post_send_msg(&a1, A1_SOURCE, 100u) != 0) fail("A1: post_send refused");
  if (post_send_msg(&b1, 0, 200u) != 0) fail("B1: post_send refused");
  for (int i = 0; i < A3_MESSAGES && g_failures == 0; ++i) expect_send_done(&a3, i);
  for (int i = 0; i < A3_MESSAGES && g_failures == 0; ++i) expect_received(&b3, B3_SLOTS + i, 300u + (uint32_t)i);
  /* A1 and B1: each CQ gets the QP's send completion and its receive, in either order. */
  if (g_failures == 0) expect_send_and_receive(&a1, A1_SOURCE, 0, 200u);
  if (g_failures == 0) expect_send_and_receive(&b1, 0, 0, 100u);
  check_rts_and_events(&a1);
  check_rts_and_events(&a3);
  check_rts_and_events(&b1);
  check_rts_and_events(&b3);
  if (g_failures) {
    printf("FAIL: scenario srq_pairing_wait: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("PASS scenario srq_pairing_wait: A3 sent %d messages to B3, A1 and B1 one each way\n",
         A3_MESSAGES);
  return 0;
}
