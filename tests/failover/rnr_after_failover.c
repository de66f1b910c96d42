/* An application that asked for few RNR retries gets RNR_RETRY_EXC_ERR after a failover too, on
   the FAKE libibverbs (docs/fake_verbs.md). Issue 19 item 12b.

   A (fake0) and B (fake2) are connected with rnr_retry 1 and min_rnr_timer 12: a SEND that
   finds no receive at B is retried once, then fails with RNR_RETRY_EXC_ERR, and A's QP goes to
   the error state (later requests are flushed). One message each way proves the pair works;
   then fake0's port goes down and one more message A -> B proves the traffic moved (with the
   shim; without it the cut breaks it: the _noshim_fails test). Then A sends with no receive
   posted at B: A must get RNR_RETRY_EXC_ERR for it within the bound, as without the shim (the
   shim's standby must not retry RNR without end), B nothing; a SEND after it is flushed.
   --no-cut: the same without the cut (run without the shim: what the fake does, like a NIC).

   Usage: rnr_after_failover rnr_after_failover [--no-cut]
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
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i)
    if (strcmp(ibv_get_device_name(list[i]), device) == 0) s->ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!s->ctx) setup_fail("opening %s", device);
  s->pd = ibv_alloc_pd(s->ctx);
  if (!s->pd || posix_memalign((void**)&s->buf, 4096, BUF_SIZE) != 0) setup_fail("PD or memory");
  memset(s->buf, 0, BUF_SIZE);
  s->mr = ibv_reg_mr(s->pd, s->buf, BUF_SIZE, ACCESS);
  s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  if (!s->mr || !s->cq || ibv_query_gid(s->ctx, 1, 1, &s->gid) != 0)
    setup_fail("MR, CQ or GID on %s", device);
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

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const int no_cut = argc == 3 && strcmp(argv[2], "--no-cut") == 0;
  if ((argc != 2 && !no_cut) || strcmp(argv[1], "rnr_after_failover") != 0) {
    fprintf(stderr, "usage: %s rnr_after_failover [--no-cut]\n", argv[0]);
    return 2;
  }
  g_scenario = "rnr_after_failover";
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  int (*port_down)(int) = (int (*)(int))fake_sym("fake_verbs_port_down");

  struct end a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  open_end(&a, "A", "fake0");
  open_end(&b, "B", "fake2");
  connect_end(&a, &b);
  connect_end(&b, &a);
  printf("QPN A=%u B=%u\n", a.qp->qp_num, b.qp->qp_num);

  message(&a, &b, 0, 0, "the first message A -> B");
  if (g_failures == 0) message(&b, &a, 1, 0, "the first message B -> A");
  if (g_failures == 0 && !no_cut) {
    if (port_down(0) != 0) setup_fail("fake_verbs_port_down(0)");
    printf("cut: fake0 port down\n");
    message(&a, &b, 2, 1, "the message A -> B after the cut");
  }
  if (g_failures == 0) {
    /* No receive at B: retried RNR_RETRY times, then the error, as the application asked. */
    if (post_send_block(&a, 3) != 0) fail("A: ibv_post_send of the SEND without a receive refused");
    expect_send(&a, 3, IBV_WC_RNR_RETRY_EXC_ERR, "the SEND B has no receive for");
  }
  if (g_failures == 0) {
    /* The error moved A's QP to the error state: what A posts next is flushed. */
    if (post_send_block(&a, 4) != 0) {
      printf("A: ibv_post_send after the error refused (the provider's choice)\n");
    } else {
      expect_send(&a, 4, IBV_WC_WR_FLUSH_ERR, "the SEND after the RNR error");
    }
  }
  struct ibv_wc wc;
  for (int i = 0; i < 8 && g_failures == 0; ++i) fake_progress();
  if (g_failures == 0 && ibv_poll_cq(b.cq, 1, &wc) != 0)
    fail("B: a completion (status %s, wr_id %#llx) for a message it had no receive for",
         ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
  if (g_failures) {
    printf("FAIL: scenario rnr_after_failover: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("PASS scenario rnr_after_failover%s: A got RNR_RETRY_EXC_ERR after %d RNR retr%s\n",
         no_cut ? " (no cut)" : "", RNR_RETRY, RNR_RETRY == 1 ? "y" : "ies");
  return 0;
}
