/*
 * Stock-style verbs program run against the FAKE libibverbs (verbs-failover test double).
 * Written in plain C against the real <infiniband/verbs.h> and linked against the real
 * libibverbs; ctest runs it with LD_LIBRARY_PATH at the fake. It opens fake0 ("host A") and
 * fake2 ("host B"), connects an RC QP pair over RoCEv2 GID index 1, and ping-pongs:
 * A --RDMA_WRITE_WITH_IMM--> B, then B --SEND--> A, ITERATIONS times, checking every byte.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "tests/common/rc_connect.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERATIONS 16
#define BUF 256

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "pingpong: FAILED at line %d: %s\n", __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

struct side {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  char buf[BUF];
  union ibv_gid gid;
};

static struct ibv_context* open_named(const char* name) {
  int n = 0, i;
  struct ibv_context* ctx = NULL;
  struct ibv_device** list = ibv_get_device_list(&n);
  CHECK(list != NULL);
  for (i = 0; i < n; ++i)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  return ctx;
}

static void setup(struct side* s, const char* name) {
  struct ibv_qp_init_attr qa;
  struct ibv_port_attr pa;
  s->ctx = open_named(name);
  CHECK(s->ctx != NULL);
  CHECK(ibv_query_port(s->ctx, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  CHECK(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0);
  s->pd = ibv_alloc_pd(s->ctx);
  CHECK(s->pd != NULL);
  s->cq = ibv_create_cq(s->ctx, 32, NULL, NULL, 0);
  CHECK(s->cq != NULL);
  s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  CHECK(s->mr != NULL);
  memset(&qa, 0, sizeof qa);
  qa.send_cq = s->cq;
  qa.recv_cq = s->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 8;
  qa.cap.max_recv_wr = 8;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  s->qp = ibv_create_qp(s->pd, &qa);
  CHECK(s->qp != NULL);
}

static void connect_to(struct side* s, const struct side* peer) {
  CHECK(vf_test_rc_connect(s->qp, peer->qp->qp_num, peer->gid, 1,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ) == 0);
}

static void post_recv(struct side* s, uint64_t id, uint32_t off, uint32_t len) {
  struct ibv_sge sge = {(uintptr_t)(s->buf + off), len, s->mr->lkey};
  struct ibv_recv_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = len ? &sge : NULL;
  wr.num_sge = len ? 1 : 0;
  CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static struct ibv_wc wait_one(struct side* s) {
  struct ibv_wc wc;
  int i;
  for (i = 0; i < 1000; ++i) {
    int n = ibv_poll_cq(s->cq, 1, &wc);
    CHECK(n >= 0);
    if (n == 1) {
      if (wc.status != IBV_WC_SUCCESS)
        fprintf(stderr, "pingpong: completion error %s\n", ibv_wc_status_str(wc.status));
      CHECK(wc.status == IBV_WC_SUCCESS);
      return wc;
    }
  }
  CHECK(!"no completion");
  return wc;
}

int main(void) {
  static struct side a, b;
  int it;
  setup(&a, "fake0");
  setup(&b, "fake2");
  CHECK(strncmp(ibv_get_device_name(a.ctx->device), "fake", 4) == 0);
  connect_to(&a, &b);
  connect_to(&b, &a);
  for (it = 0; it < ITERATIONS; ++it) {
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    char expect[64];

    /* ping: A writes into B's buffer with an immediate; B consumes a zero-SGE receive */
    post_recv(&b, 1000 + it, 0, 0);
    snprintf(a.buf, 64, "ping %d", it);
    sge.addr = (uintptr_t)a.buf;
    sge.length = 64;
    sge.lkey = a.mr->lkey;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = it;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(it);
    wr.wr.rdma.remote_addr = (uintptr_t)(b.buf + 64);
    wr.wr.rdma.rkey = b.mr->rkey;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
    wc = wait_one(&a);
    CHECK(wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == (uint64_t)it);
    wc = wait_one(&b);
    CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(wc.wr_id == (uint64_t)(1000 + it));
    CHECK(ntohl(wc.imm_data) == (uint32_t)it);
    CHECK(wc.byte_len == 64);
    snprintf(expect, sizeof expect, "ping %d", it);
    CHECK(strcmp(b.buf + 64, expect) == 0);

    /* pong: B sends back to A */
    post_recv(&a, 2000 + it, 128, 64);
    snprintf(b.buf, 64, "pong %d", it);
    sge.addr = (uintptr_t)b.buf;
    sge.length = (uint32_t)strlen(b.buf) + 1;
    sge.lkey = b.mr->lkey;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 500 + it;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(b.qp, &wr, &bad) == 0);
    wc = wait_one(&b);
    CHECK(wc.opcode == IBV_WC_SEND && wc.wr_id == (uint64_t)(500 + it));
    wc = wait_one(&a);
    CHECK(wc.opcode == IBV_WC_RECV && wc.wr_id == (uint64_t)(2000 + it));
    snprintf(expect, sizeof expect, "pong %d", it);
    CHECK(wc.byte_len == strlen(expect) + 1);
    CHECK(strcmp(a.buf + 128, expect) == 0);
  }
  CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0);
  CHECK(ibv_dereg_mr(a.mr) == 0 && ibv_dereg_mr(b.mr) == 0);
  CHECK(ibv_destroy_cq(a.cq) == 0 && ibv_destroy_cq(b.cq) == 0);
  CHECK(ibv_dealloc_pd(a.pd) == 0 && ibv_dealloc_pd(b.pd) == 0);
  CHECK(ibv_close_device(a.ctx) == 0 && ibv_close_device(b.ctx) == 0);
  printf("pingpong: %d RDMA_WRITE_WITH_IMM + SEND round trips between fake0 and fake2: PASS\n",
         ITERATIONS);
  return 0;
}
