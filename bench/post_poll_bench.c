/* Healthy-path cost of the shim on the fake fabric, on an RC QP pair between fake0 and fake2.
   Under the shim both QPs are protected (fake0 is backed by fake1, fake2 by fake3, and the two
   QPs pair locally in this process), so this times the protected data path: retransmit-ring
   recording in post_send, receive-ring recording in post_recv, ring retirement per
   completion in poll_cq. bench/check_protected.sh verifies that from the shim's log.
   Measured (ns per call unless said otherwise):
     empty_poll_ns   ibv_poll_cq on an empty CQ
     post_send_ns    ibv_post_send of an inline 8-byte RDMA_WRITE (15 unsignaled + 1 signaled per
                     batch of 16; only the posting is timed)
     send_poll_ns    ibv_poll_cq calls that reap the batch's one signaled completion (each retires
                     16 ring entries under the shim)
     post_recv_ns    ibv_post_recv of one 64-byte receive (batches of 16)
     recv_poll_ns    ibv_poll_cq reaping receive completions, per completion (16 per batch, polled
                     with num_entries=16; the peer's inline 8-byte SENDs are not timed)
   Each figure is printed twice: the mean over the whole run (*_ns) and the median over its short
   batches of 16 calls (*_p50_ns). A VM's steal time and interrupts land in a few batches and
   inflate the mean of whichever run they hit; the batch median leaves them out.
   Run it with and without LD_PRELOAD=libverbs_failover.so (bench/run.sh alternates the two) and
   compare: the difference is what the shim adds.
   --idle-pair (bench/run.sh gives it to the runs without the shim) also connects an RC QP pair
   between fake1 and fake3 that carries nothing, like the standby pair the shim creates. The fake
   (not a real provider) visits every QP of its fabric on each post and poll (its progress
   model), so without that pair the runs without the shim would do less of the fake's own work
   and the difference would charge the fake's cost of the standby QPs to the shim's code.
   --after-failback (under the shim only) first cuts fake0's port, waits (bounded) until both QPs
   have failed over, brings the port back and waits until both have failed back, with one
   signaled write at a time going on, then measures: the healthy path after a failback, which
   must be within noise of a run that never failed over (issue 19 item 11; bench/run.sh
   --after-failback compares the two).
   Usage: post_poll_bench [iterations] [--idle-pair | --after-failback]
   (needs LD_LIBRARY_PATH at the fake) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include "tests/common/rc_connect.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Per-batch figures (ns per call), for their median. */
struct samples {
  double* values;
  long count, capacity;
};

static void fail(const char* what);

static void samples_init(struct samples* s, long capacity) {
  s->values = malloc((size_t)capacity * sizeof(double));
  if (!s->values) fail("malloc");
  s->count = 0;
  s->capacity = capacity;
}

static void samples_add(struct samples* s, double value) {
  if (s->count < s->capacity) s->values[s->count++] = value;
}

static int compare_doubles(const void* x, const void* y) {
  const double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

static double samples_median(struct samples* s) {
  if (s->count == 0) return 0;
  qsort(s->values, (size_t)s->count, sizeof(double), compare_doubles);
  return s->values[s->count / 2];
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

struct end {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  union ibv_gid gid;
  char buf[4096];
};

static void fail(const char* what) {
  fprintf(stderr, "post_poll_bench: %s failed\n", what);
  exit(1);
}

static void open_end(struct end* e, struct ibv_device* dev) {
  if (!(e->ctx = ibv_open_device(dev))) fail("open");
  if (!(e->pd = ibv_alloc_pd(e->ctx))) fail("pd");
  if (!(e->cq = ibv_create_cq(e->ctx, 256, NULL, NULL, 0))) fail("cq");
  if (!(e->mr = ibv_reg_mr(e->pd, e->buf, sizeof(e->buf),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))) fail("mr");
  struct ibv_qp_init_attr a = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                               .cap = {.max_send_wr = 128, .max_recv_wr = 32, .max_send_sge = 1,
                                       .max_recv_sge = 1, .max_inline_data = 64}};
  if (!(e->qp = ibv_create_qp(e->pd, &a))) fail("qp");
  if (ibv_query_gid(e->ctx, 1, 1, &e->gid)) fail("gid");
}

static void connect_end(struct end* e, struct end* peer) {
  if (vf_test_rc_connect(e->qp, peer->qp->qp_num, peer->gid, 1, IBV_ACCESS_REMOTE_WRITE)) {
    fail("connect");
  }
}

/* One signaled inline write a -> b, reaped (bounded). */
static void one_write(struct end* a, struct end* b) {
  struct ibv_sge sge = {.addr = (uintptr_t)a->buf, .length = 8, .lkey = a->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge, .num_sge = 1,
                           .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
  wr.wr.rdma.rkey = b->mr->rkey;
  struct ibv_send_wr* bad = NULL;
  if (ibv_post_send(a->qp, &wr, &bad)) fail("post_send (failover traffic)");
  struct ibv_wc wc;
  const double deadline = now_ns() + 10e9;
  int got = 0;
  while ((got = ibv_poll_cq(a->cq, 1, &wc)) == 0) {
    if (now_ns() > deadline) fail("write completion during the failover");
  }
  if (got < 0 || wc.status != IBV_WC_SUCCESS) fail("write during the failover");
}

/* Writes go on until both QPs are on `path` (0 primary, 1 standby) with `field` (0 failovers, 1
   failbacks) at least 1; bounded. */
static void wait_switched(struct end* a, struct end* b, int path, int field) {
  int (*switches)(uint32_t, unsigned long*, unsigned long*) =
      (int (*)(uint32_t, unsigned long*, unsigned long*))dlsym(RTLD_DEFAULT,
                                                              "verbs_failover_debug_qp_switches");
  if (switches == NULL) fail("--after-failback without the shim: finding its debug hook");
  const double deadline = now_ns() + 30e9;
  for (;;) {
    int done = 1;
    for (int side = 0; side < 2; ++side) {
      unsigned long counts[2] = {0, 0};
      const int at = switches((side ? b : a)->qp->qp_num, &counts[0], &counts[1]);
      done &= at == path && counts[field] >= 1;
    }
    if (done) return;
    if (now_ns() > deadline) fail(field ? "waiting for the failback" : "waiting for the failover");
    one_write(a, b);
  }
}

static void fail_over_and_back(struct end* a, struct end* b) {
  int (*port_down)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "fake_verbs_port_down");
  int (*port_up)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "fake_verbs_port_up");
  if (port_down == NULL || port_up == NULL) fail("finding the fake's port controls");
  one_write(a, b);
  if (port_down(0) != 0) fail("fake_verbs_port_down(0)");
  wait_switched(a, b, 1, 0);
  if (port_up(0) != 0) fail("fake_verbs_port_up(0)");
  wait_switched(a, b, 0, 1);
}

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? atol(argv[1]) : 1000000;
  const int idle_pair = argc > 2 && strcmp(argv[2], "--idle-pair") == 0;
  const int after_failback = argc > 2 && strcmp(argv[2], "--after-failback") == 0;
  if (iterations < 16 || (argc > 2 && !idle_pair && !after_failback)) {
    fprintf(stderr,
            "usage: post_poll_bench [iterations >= 16] [--idle-pair | --after-failback]\n");
    return 2;
  }
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 4) fail("device list (run with LD_LIBRARY_PATH at the fake libibverbs)");
  static struct end a, b, idle_c, idle_d;
  open_end(&a, list[0]);
  open_end(&b, list[2]);
  connect_end(&a, &b);
  connect_end(&b, &a);
  if (idle_pair) {
    open_end(&idle_c, list[1]);
    open_end(&idle_d, list[3]);
    connect_end(&idle_c, &idle_d);
    connect_end(&idle_d, &idle_c);
  }

  if (after_failback) fail_over_and_back(&a, &b);

  const long batches = iterations / 16 + 2;
  struct samples empty_poll_s, post_send_s, send_poll_s, post_recv_s, recv_poll_s;
  samples_init(&empty_poll_s, batches);
  samples_init(&post_send_s, batches);
  samples_init(&send_poll_s, batches);
  samples_init(&post_recv_s, batches);
  samples_init(&recv_poll_s, batches);

  struct ibv_wc wc[4];
  for (long i = 0; i < 1000; ++i) ibv_poll_cq(a.cq, 4, wc); /* warm up */
  double start = now_ns();
  for (long i = 0; i < iterations; i += 16) {
    const double t0 = now_ns();
    for (int k = 0; k < 16; ++k) {
      if (ibv_poll_cq(a.cq, 4, wc) != 0) fail("empty poll");
    }
    samples_add(&empty_poll_s, (now_ns() - t0) / 16);
  }
  const long empty_polls = (iterations + 15) / 16 * 16;
  const double poll_ns = (now_ns() - start) / (double)empty_polls;

  /* 15 unsignaled writes and one signaled one per batch; the posting and the reaping polls are
     timed separately. */
  struct ibv_sge sge = {.addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey};
  struct ibv_send_wr wr = {.opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge, .num_sge = 1};
  wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
  wr.wr.rdma.rkey = b.mr->rkey;
  struct ibv_send_wr* bad = NULL;
  double post_total = 0, send_poll_total = 0;
  long posts = 0, send_polls = 0;
  while (posts < iterations) {
    double t0 = now_ns();
    for (int k = 0; k < 16; ++k) {
      wr.wr_id = (uint64_t)posts;
      wr.send_flags = IBV_SEND_INLINE | (k == 15 ? IBV_SEND_SIGNALED : 0);
      if (ibv_post_send(a.qp, &wr, &bad)) fail("post_send");
      ++posts;
    }
    const double t1 = now_ns();
    post_total += t1 - t0;
    samples_add(&post_send_s, (t1 - t0) / 16);
    int got = 0;
    long batch_polls = 0;
    for (long spins = 0; got == 0; ++spins) {
      ++batch_polls;
      got = ibv_poll_cq(a.cq, 4, wc);
      ++send_polls;
      if (got < 0 || (got > 0 && (wc[0].status != IBV_WC_SUCCESS ||
                                  wc[0].wr_id != (uint64_t)(posts - 1)))) {
        fail("send completion");
      }
      if (spins > 100000000) fail("completion timeout");
    }
    const double t2 = now_ns();
    send_poll_total += t2 - t1;
    samples_add(&send_poll_s, (t2 - t1) / (double)batch_polls);
  }

  /* Receives: b posts 16, a sends 16 inline 8-byte messages (untimed; 15 unsignaled + 1
     signaled), b reaps the 16 receive completions (timed per completion). */
  struct ibv_sge rsge = {.addr = (uintptr_t)b.buf, .length = 64, .lkey = b.mr->lkey};
  struct ibv_recv_wr rwr = {.sg_list = &rsge, .num_sge = 1};
  struct ibv_recv_wr* rbad = NULL;
  struct ibv_send_wr swr = {.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1};
  struct ibv_wc rwc[16];
  double recv_post_total = 0, recv_poll_total = 0;
  long recvs = 0, reaped = 0;
  while (recvs < iterations) {
    double t0 = now_ns();
    for (int k = 0; k < 16; ++k) {
      rwr.wr_id = (uint64_t)(recvs + k);
      if (ibv_post_recv(b.qp, &rwr, &rbad)) fail("post_recv");
    }
    const double posted_at = now_ns();
    recv_post_total += posted_at - t0;
    samples_add(&post_recv_s, (posted_at - t0) / 16);
    for (int k = 0; k < 16; ++k) {
      swr.wr_id = (uint64_t)k;
      swr.send_flags = IBV_SEND_INLINE | (k == 15 ? IBV_SEND_SIGNALED : 0);
      if (ibv_post_send(a.qp, &swr, &bad)) fail("post_send (SEND)");
    }
    int batch_got = 0;
    t0 = now_ns();
    for (long spins = 0; batch_got < 16; ++spins) {
      const int got = ibv_poll_cq(b.cq, 16 - batch_got, rwc);
      if (got < 0) fail("receive completion");
      for (int i = 0; i < got; ++i) {
        if (rwc[i].status != IBV_WC_SUCCESS || rwc[i].opcode != IBV_WC_RECV ||
            rwc[i].wr_id != (uint64_t)(recvs + batch_got + i)) {
          fail("receive completion");
        }
      }
      batch_got += got;
      if (spins > 100000000) fail("receive completion timeout");
    }
    const double reaped_at = now_ns();
    recv_poll_total += reaped_at - t0;
    samples_add(&recv_poll_s, (reaped_at - t0) / (double)batch_got);
    reaped += batch_got;
    recvs += 16;
    int got = 0;
    for (long spins = 0; got == 0; ++spins) {
      got = ibv_poll_cq(a.cq, 4, wc);
      if (got < 0 || (got > 0 && wc[0].status != IBV_WC_SUCCESS)) fail("SEND completion");
      if (spins > 100000000) fail("SEND completion timeout");
    }
  }
  printf("empty_poll_ns=%.2f post_send_ns=%.2f send_poll_ns=%.2f post_recv_ns=%.2f "
         "recv_poll_ns=%.2f empty_poll_p50_ns=%.2f post_send_p50_ns=%.2f send_poll_p50_ns=%.2f "
         "post_recv_p50_ns=%.2f recv_poll_p50_ns=%.2f iterations=%ld\n",
         poll_ns, post_total / (double)posts, send_poll_total / (double)send_polls,
         recv_post_total / (double)recvs, recv_poll_total / (double)reaped,
         samples_median(&empty_poll_s), samples_median(&post_send_s),
         samples_median(&send_poll_s), samples_median(&post_recv_s),
         samples_median(&recv_poll_s), iterations);
  return 0;
}
