/* A server whose clients come and go, on one shared receive queue (issue 19 item 3), on the FAKE
   libibverbs (docs/fake_verbs.md), with or without the shim: it must behave the same.

   The server (fake0, backed up by fake1) keeps SRQ_DEPTH receives posted on an SRQ of that depth
   and reposts each receive it gets back, as servers do. ROUNDS clients (fake2) come one after
   another, each with its own QP pair: the client sends one message that fits (the server gets it
   and checks its bytes), then, in even rounds, one too long for a receive (the server's receive
   completes with IBV_WC_LOC_LEN_ERR and its QP fails, as RC does) and, in odd rounds, one the
   server leaves unpolled until its QP is destroyed (its receive is then never seen again: rxe
   keeps the completion of a destroyed QP in the CQ, mlx5 removes it). Then both QPs are
   destroyed. Without retiring the records of error completions and of receives lost with
   their QP, the shim's SRQ record fills within a few rounds and ibv_post_srq_recv fails with
   ENOMEM although only SRQ_DEPTH receives are ever outstanding.

   Usage: srq_churn srq_churn
   Output: "PASS scenario srq_churn ..." and exit 0; "FAIL: [...]" lines and exit 1; "SETUP:" 3.
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

#define SRQ_DEPTH 4
#define ROUNDS 40
#define MSG_LEN 64
#define LONG_LEN (2 * MSG_LEN)
#define BUF_SIZE 65536
#define WAIT_MS 10000
#define RECV_WR(slot) (0x5000u + (uint64_t)(slot))
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void (*fake_progress)(void);

struct host { /* one side's device: context, PD, buffer, MR, CQ, GID */
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  uint8_t* buf;
  struct ibv_mr* mr;
  struct ibv_cq* cq;
  union ibv_gid gid;
};

static struct host g_server, g_client;
static struct ibv_srq* g_srq;

static void open_host(struct host* h, const char* device) {
  h->ctx = open_device_named(device);
  h->pd = ibv_alloc_pd(h->ctx);
  h->mr = register_zeroed_buffer(h->pd, BUF_SIZE, ACCESS, &h->buf);
  h->cq = ibv_create_cq(h->ctx, 64, NULL, NULL, 0);
  if (!h->cq || ibv_query_gid(h->ctx, 1, 1, &h->gid) != 0) setup_fail("CQ or GID on %s", device);
}

static struct ibv_qp* create_qp(struct host* h, struct ibv_srq* srq) {
  struct ibv_qp_init_attr attr = {
      .send_cq = h->cq, .recv_cq = h->cq, .srq = srq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 8, .max_recv_wr = srq ? 0 : 8, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = ibv_create_qp(h->pd, &attr);
  if (!qp) setup_fail("ibv_create_qp");
  return qp;
}

static uint8_t* slot_buffer(int slot) { return g_server.buf + BUF_SIZE / 2 + (size_t)slot * MSG_LEN; }

/* The receive of one slot on the SRQ: 0, or the verb's error (the failure this test is about). */
static int post_slot(int slot) {
  memset(slot_buffer(slot), 0, MSG_LEN);
  struct ibv_sge sge = {(uintptr_t)slot_buffer(slot), MSG_LEN, g_server.mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = RECV_WR(slot), .sg_list = &sge, .num_sge = 1};
  struct ibv_recv_wr* bad = NULL;
  return ibv_post_srq_recv(g_srq, &wr, &bad);
}

static int send_bytes(struct ibv_qp* qp, int length, uint8_t seed, uint64_t wr_id) {
  uint8_t* src = g_client.buf;
  for (int k = 0; k < length; ++k) src[k] = (uint8_t)(seed + k);
  struct ibv_sge sge = {(uintptr_t)src, (uint32_t)length, g_client.mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr* bad = NULL;
  return ibv_post_send(qp, &wr, &bad);
}

/* One completion of h's CQ within WAIT_MS (1), or a failure (0). */
static int poll_one(struct host* h, struct ibv_wc* wc, const char* what, int round) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (now_ms() < deadline) {
    const int n = ibv_poll_cq(h->cq, 1, wc);
    if (n < 0) {
      fail("round %d: ibv_poll_cq returned %d", round, n);
      return 0;
    }
    if (n == 1) return 1;
    fake_progress();
  }
  fail("round %d: no completion for %s within %d ms", round, what, WAIT_MS);
  return 0;
}

/* The server gets one receive back: its slot (reposted), or -1 after a failure. */
static int server_receives(int round, enum ibv_wc_status status, const char* what,
                           uint32_t qp_num) {
  struct ibv_wc wc;
  if (!poll_one(&g_server, &wc, what, round)) return -1;
  const uint64_t slot = wc.wr_id - RECV_WR(0);
  if (wc.status != status || slot >= SRQ_DEPTH || wc.qp_num != qp_num) {
    fail("round %d: %s completed with status %s, wr_id %#llx, qp %u; expected %s on qp %u",
         round, what, ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id, wc.qp_num,
         ibv_wc_status_str(status), qp_num);
    return -1;
  }
  return (int)slot;
}

static void client_completes(int round, uint64_t wr_id, int ok, const char* what) {
  struct ibv_wc wc;
  if (!poll_one(&g_client, &wc, what, round)) return;
  if (wc.wr_id != wr_id || (ok && wc.status != IBV_WC_SUCCESS) || (!ok && wc.status == IBV_WC_SUCCESS))
    fail("round %d: the client's %s completed with status %s, wr_id %#llx", round, what,
         ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
}

static void repost(int round, int slot) {
  const int error = post_slot(slot);
  if (error != 0)
    fail("round %d: ibv_post_srq_recv of slot %d failed (%s) with %d receive(s) outstanding",
         round, slot, strerror(error), SRQ_DEPTH - 1);
}

static void one_client(int round) {
  struct ibv_qp* server = create_qp(&g_server, g_srq);
  struct ibv_qp* client = create_qp(&g_client, NULL);
  if (vf_test_rc_connect(server, client->qp_num, g_client.gid, 1, ACCESS) ||
      vf_test_rc_connect(client, server->qp_num, g_server.gid, 1, ACCESS))
    setup_fail("round %d: connecting", round);
  /* A message that fits: received whole. */
  const uint8_t seed = (uint8_t)(round * 3);
  if (send_bytes(client, MSG_LEN, seed, 1) != 0) setup_fail("round %d: ibv_post_send", round);
  int slot = server_receives(round, IBV_WC_SUCCESS, "the message that fits", server->qp_num);
  if (slot < 0) return;
  for (int k = 0; k < MSG_LEN; ++k) {
    if (slot_buffer(slot)[k] != (uint8_t)(seed + k)) {
      fail("round %d: byte %d of the message in slot %d is %u, expected %u", round, k, slot,
           slot_buffer(slot)[k], (uint8_t)(seed + k));
      return;
    }
  }
  client_completes(round, 1, 1, "message that fits");
  repost(round, slot);
  /* In every other round, a message the server leaves unpolled until its QP is gone. */
  int unpolled = 0;
  if (round % 2 == 1) {
    if (send_bytes(client, MSG_LEN, seed, 2) != 0) setup_fail("round %d: ibv_post_send", round);
    client_completes(round, 2, 1, "message left unpolled");
    unpolled = 1;
  }
  /* A message too long: the server's receive fails and so does its QP. */
  if (!unpolled) {
    if (send_bytes(client, LONG_LEN, seed, 3) != 0) setup_fail("round %d: ibv_post_send", round);
    slot = server_receives(round, IBV_WC_LOC_LEN_ERR, "the message too long", server->qp_num);
    if (slot < 0) return;
    client_completes(round, 3, 0, "message too long");
    repost(round, slot);
  }
  if (ibv_destroy_qp(server) || ibv_destroy_qp(client)) setup_fail("round %d: destroying", round);
  if (unpolled) {
    /* Its receive is gone with the QP (its completion, if the device kept it, is of no QP the
       server has): the server gives the buffer back to the SRQ, as after a client's error. */
    struct ibv_wc wc;
    while (ibv_poll_cq(g_server.cq, 1, &wc) > 0) {
    }
    /* The SRQ hands out receives in posting order: the lost one is the slot after the one
       reposted last (reposting a buffer the SRQ still holds would be the test's own error). */
    repost(round, (slot + 1) % SRQ_DEPTH);
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2 || strcmp(argv[1], "srq_churn") != 0) {
    fprintf(stderr, "usage: %s srq_churn\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  open_host(&g_server, "fake0");
  open_host(&g_client, "fake2");
  struct ibv_srq_init_attr srq_attr = {.attr = {.max_wr = SRQ_DEPTH, .max_sge = 1}};
  g_srq = ibv_create_srq(g_server.pd, &srq_attr);
  if (!g_srq) setup_fail("ibv_create_srq");
  for (int slot = 0; slot < SRQ_DEPTH; ++slot)
    if (post_slot(slot) != 0) setup_fail("posting slot %d", slot);
  for (int round = 0; round < ROUNDS && g_failures == 0; ++round) one_client(round);
  if (g_failures) {
    printf("FAIL: scenario srq_churn: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("PASS scenario srq_churn: %d clients came and went, %d receives outstanding throughout\n",
         ROUNDS, SRQ_DEPTH);
  return 0;
}
