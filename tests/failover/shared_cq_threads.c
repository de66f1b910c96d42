/* Threads through cut/heal cycles (issue 19, "concurrency"), on the FAKE libibverbs
   (docs/fake_verbs.md), with or without the shim; built a second time with ThreadSanitizer and
   run under a shim built the same way (tests/failover/CMakeLists.txt).

   Host A (fake0, backed up by fake1) has NQP RC QPs to host B (fake2, backed up by fake3); A's
   QPs all complete on ONE CQ, B's on another. NQP posting threads (one per QP) send numbered
   messages, about two in three signaled, each keeping at most WINDOW in flight; POLLERS threads
   poll A's CQ together; one thread on B receives, checks every message's bytes and its order on
   its QP, and posts the receive again; one thread stands in for the NICs (the fake's progress).
   The main thread cuts A's rail 0 CYCLES times: port down, every QP's traffic must go on (on
   the standby), port up, every QP's traffic must come back to fake0 (a failback) before the
   next cut. In even cycles
   after the first the cut waits until NQP QPs are in RTS on each of fake1 and fake3 (mostly the
   standbys connected again; a standby not yet reset after the failback also counts, so not
   every even cycle is an ordinary failover); in odd cycles it comes at once, often before the
   re-arm (the QPs then wait for a path: the standby's re-arm or the primary). The stats of the
   first pair (the QPN line) must show every cycle; every QP's move is checked by the program.

   Checked: every signaled request completes exactly once, with SUCCESS, on its own QP; B gets
   every message once, in order, with its bytes; nothing more arrives at the end; every wait is
   bounded (a hang is a failure). Under ThreadSanitizer any access the locks of the shim (or of
   this program) do not order is reported and fails the run.

   Usage: shared_cq_threads cut_heal_cycles
   Output: "QPN A=<first A QP> B=<its peer>", then "PASS scenario ..." and exit 0; "FAIL: [...]"
   lines and exit 1; "SETUP:" and exit 3. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/rc_connect.h"
#include "tests/common/scenario_report.h"

#define NQP 4
#define POLLERS 2
#define CYCLES 100
#define WINDOW 16        /* messages in flight per QP, at most */
#define SRC_SLOTS 32     /* sources per QP: a slot is reused only when its message completed */
#define RQ_DEPTH 32      /* receives posted per QP on B */
#define MAX_MSGS 262144  /* per QP, at most (a run sends about 3 * CYCLES * BUDGET_STEP) */
#define BUDGET_STEP 64   /* messages per QP the posters may send for each wait of the main thread
                            (more while a wait finds the QP it waits for idle) */
#define STEP_MSGS 24     /* completions that show traffic moving (before a cut) */
#define QP_STEP 8        /* messages per QP that show it moved (after a cut, after a heal) */
#define MSG_LEN 64
#define BUF_SIZE ((size_t)NQP * (SRC_SLOTS + RQ_DEPTH) * MSG_LEN)
#define WAIT_MS 20000
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void (*fake_progress)(void);
static int (*fake_port_down)(int), (*fake_port_up)(int);
static int (*fake_list_qps)(int, uint32_t*, int);
static int (*fake_qp_stats)(uint32_t, struct fake_verbs_qp_stats*);

struct host {
  const char* name;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  uint8_t* buf;
  struct ibv_mr* mr;
  struct ibv_cq* cq;
  union ibv_gid gid;
  struct ibv_qp* qp[NQP];
};

static struct host g_a = {.name = "A"}, g_b = {.name = "B"};

/* Per A-QP state shared by its poster and the pollers. */
static atomic_int g_sent[NQP];      /* messages posted (written by the poster only) */
static atomic_int g_done[NQP];      /* 1 + the highest message whose completion was seen */
static atomic_uchar g_seen[NQP][MAX_MSGS]; /* signaled completions seen, per message */
static atomic_llong g_completions;  /* signaled completions seen on A, all QPs */
static int g_received[NQP];         /* B's thread only */
static atomic_llong g_receptions;   /* messages B got, all QPs */
static atomic_int g_stop_posting, g_stop_all, g_fails;
static atomic_int g_budget; /* messages per QP the posters may have sent: paced by the waits */

static void failure(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void failure(const char* fmt, ...) {
  if (atomic_fetch_add(&g_fails, 1) < 20) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("FAIL: [%s] %s\n", g_scenario, line);
  }
  atomic_store(&g_stop_posting, 1);
}

static int signaled(int seq) { return seq % 3 != 1; }

static uint8_t pattern(int qp, int seq, int k) { return (uint8_t)(qp * 41 + seq * 13 + k); }

static uint8_t* src_slot(int qp, int seq) {
  return g_a.buf + ((size_t)qp * SRC_SLOTS + (size_t)(seq % SRC_SLOTS)) * MSG_LEN;
}

static uint8_t* recv_slot(int qp, int slot) {
  return g_b.buf + ((size_t)NQP * SRC_SLOTS + (size_t)qp * RQ_DEPTH + (size_t)slot) * MSG_LEN;
}

static void open_host(struct host* h, const char* device) {
  h->ctx = open_device_named(device);
  h->pd = ibv_alloc_pd(h->ctx);
  h->mr = register_zeroed_buffer(h->pd, BUF_SIZE, ACCESS, &h->buf);
  h->cq = ibv_create_cq(h->ctx, NQP * (WINDOW + RQ_DEPTH) + 16, NULL, NULL, 0);
  if (!h->cq || ibv_query_gid(h->ctx, 1, 1, &h->gid) != 0)
    setup_fail("CQ or GID on %s", device);
  for (int i = 0; i < NQP; ++i) {
    struct ibv_qp_init_attr attr = {
        .send_cq = h->cq, .recv_cq = h->cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 2 * WINDOW, .max_recv_wr = RQ_DEPTH, .max_send_sge = 1,
                .max_recv_sge = 1}};
    h->qp[i] = ibv_create_qp(h->pd, &attr);
    if (!h->qp[i]) setup_fail("ibv_create_qp on %s", h->name);
  }
}

static void post_receive(int qp, int slot) {
  struct ibv_sge sge = {(uintptr_t)recv_slot(qp, slot), MSG_LEN, g_b.mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = ((uint64_t)qp << 32) | (uint64_t)slot, .sg_list = &sge,
                           .num_sge = 1};
  struct ibv_recv_wr* bad = NULL;
  const int error = ibv_post_recv(g_b.qp[qp], &wr, &bad);
  if (error != 0) failure("B: ibv_post_recv on qp %d: %s", qp, strerror(error));
}

/* One of A's posting threads: numbered messages on its own QP, WINDOW in flight at most. */
static void* poster(void* arg) {
  const int qp = (int)(intptr_t)arg;
  while (!atomic_load(&g_stop_posting)) {
    const int seq = atomic_load_explicit(&g_sent[qp], memory_order_relaxed);
    if (seq >= MAX_MSGS) break;
    if (seq >= atomic_load(&g_budget) || seq - atomic_load(&g_done[qp]) >= WINDOW) {
      sched_yield();
      continue;
    }
    uint8_t* src = src_slot(qp, seq);
    for (int k = 0; k < MSG_LEN; ++k) src[k] = pattern(qp, seq, k);
    struct ibv_sge sge = {(uintptr_t)src, MSG_LEN, g_a.mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ((uint64_t)qp << 32) | (uint64_t)seq, .sg_list = &sge,
                             .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = signaled(seq) ? IBV_SEND_SIGNALED : 0};
    struct ibv_send_wr* bad = NULL;
    const int error = ibv_post_send(g_a.qp[qp], &wr, &bad);
    if (error != 0) {
      failure("A: ibv_post_send of message %d on qp %d: %s", seq, qp, strerror(error));
      break;
    }
    atomic_store(&g_sent[qp], seq + 1);
  }
  return NULL;
}

/* One of the threads polling A's shared CQ. */
static void* poller(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop_all)) {
    struct ibv_wc wc[4];
    const int n = ibv_poll_cq(g_a.cq, 4, wc);
    if (n < 0) failure("A: ibv_poll_cq returned %d", n);
    if (n <= 0) {
      sched_yield();
      continue;
    }
    for (int i = 0; i < n; ++i) {
      /* unsigned: a wr_id the shim failed to translate must fail here, not index out of range */
      const uint64_t qp = wc[i].wr_id >> 32, seq = (uint32_t)wc[i].wr_id;
      if (wc[i].status != IBV_WC_SUCCESS || qp >= NQP || seq >= MAX_MSGS ||
          wc[i].qp_num != g_a.qp[qp]->qp_num || wc[i].opcode != IBV_WC_SEND) {
        failure("A: wr_id %#llx on qp %u: status %s, opcode %d", (unsigned long long)wc[i].wr_id,
                wc[i].qp_num, ibv_wc_status_str(wc[i].status), wc[i].opcode);
        continue;
      }
      if (!signaled((int)seq))
        failure("A: a completion of unsignaled message %d on qp %d", (int)seq, (int)qp);
      if (atomic_exchange(&g_seen[qp][seq], 1) != 0)
        failure("A: message %d on qp %d completed twice", (int)seq, (int)qp);
      for (int done = atomic_load(&g_done[qp]);
           done < (int)seq + 1 && !atomic_compare_exchange_weak(&g_done[qp], &done, (int)seq + 1);) {
      }
      atomic_fetch_add(&g_completions, 1);
    }
  }
  return NULL;
}

/* B: every message once, in order on its QP, with its bytes; its receive posted again. */
static void* receiver(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop_all)) {
    struct ibv_wc wc[8];
    const int n = ibv_poll_cq(g_b.cq, 8, wc);
    if (n < 0) failure("B: ibv_poll_cq returned %d", n);
    if (n <= 0) {
      sched_yield();
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t qp_index = wc[i].wr_id >> 32, slot_index = (uint32_t)wc[i].wr_id;
      if (wc[i].status != IBV_WC_SUCCESS || qp_index >= NQP || slot_index >= RQ_DEPTH ||
          wc[i].opcode != IBV_WC_RECV || wc[i].qp_num != g_b.qp[qp_index]->qp_num) {
        failure("B: wr_id %#llx on qp %u: status %s, opcode %d", (unsigned long long)wc[i].wr_id,
                wc[i].qp_num, ibv_wc_status_str(wc[i].status), wc[i].opcode);
        continue;
      }
      const int qp = (int)qp_index, slot = (int)slot_index;
      const int seq = g_received[qp]++;
      if (slot != seq % RQ_DEPTH || wc[i].byte_len != MSG_LEN) {
        failure("B: message %d on qp %d came in slot %d (%u bytes), expected slot %d", seq, qp,
                slot, wc[i].byte_len, seq % RQ_DEPTH);
        continue;
      }
      for (int k = 0; k < MSG_LEN; ++k) {
        if (recv_slot(qp, slot)[k] != pattern(qp, seq, k)) {
          failure("B: message %d on qp %d: byte %d is %u, expected %u (a message lost, "
                  "repeated or reordered)", seq, qp, k, recv_slot(qp, slot)[k],
                  pattern(qp, seq, k));
          break;
        }
      }
      memset(recv_slot(qp, slot), 0, MSG_LEN);
      post_receive(qp, slot);
      atomic_fetch_add(&g_receptions, 1);
    }
  }
  return NULL;
}

/* The NICs: the fake moves work only in progress steps. */
static void* nic(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop_all)) {
    fake_progress();
    sched_yield();
  }
  return NULL;
}

static void allow_more(void) {
  if (atomic_load(&g_budget) + BUDGET_STEP <= MAX_MSGS) atomic_fetch_add(&g_budget, BUDGET_STEP);
}

/* Waits until A's signaled completions pass `mark` + STEP_MSGS and B's receptions pass
   `received` + STEP_MSGS: traffic flows both on the requester's and on the responder's side. */
static int wait_traffic(long long mark, long long received, const char* what, int cycle) {
  allow_more();
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (atomic_load(&g_completions) < mark + STEP_MSGS ||
         atomic_load(&g_receptions) < received + STEP_MSGS) {
    if (atomic_load(&g_fails)) return -1;
    if (now_ms() > deadline) {
      failure("cycle %d: no traffic %s within %d ms (completions %lld, receptions %lld)", cycle,
              what, WAIT_MS, (long long)atomic_load(&g_completions),
              (long long)atomic_load(&g_receptions));
      return -1;
    }
    sched_yield();
  }
  return 0;
}

/* Messages A's QP qp has sent from its own QP (the primary: fake0), by the fake's count. */
static uint64_t sent_on_primary(int qp) {
  struct fake_verbs_qp_stats st;
  if (fake_qp_stats(g_a.qp[qp]->qp_num, &st) != 0) {
    failure("the fake does not know A's qp %d", qp);
    return 0;
  }
  return st.messages_sent;
}

/* Waits until every one of A's QPs shows it has moved, within WAIT_MS:
   - after the cut (failback 0): QP_STEP messages posted after the cut completed. fake0 is down,
     so they went over the standby: every QP failed over, not only some;
   - after the heal (failback 1): its own QP on fake0 sent QP_STEP messages more: every QP
     failed back. */
static int wait_each_qp_moved(int cycle, int failback) {
  allow_more();
  uint64_t mark[NQP];
  for (int qp = 0; qp < NQP; ++qp)
    mark[qp] = failback ? sent_on_primary(qp) : (uint64_t)atomic_load(&g_sent[qp]);
  const uint64_t deadline = now_ms() + WAIT_MS;
  for (int qp = 0; qp < NQP;) {
    const uint64_t now = failback ? sent_on_primary(qp) : (uint64_t)atomic_load(&g_done[qp]);
    if (now >= mark[qp] + QP_STEP) {
      ++qp;
      continue;
    }
    if (atomic_load(&g_sent[qp]) >= atomic_load(&g_budget)) allow_more(); /* it ran dry */
    if (atomic_load(&g_fails)) return -1;
    if (now_ms() > deadline) {
      failure("cycle %d: qp %d %s within %d ms", cycle, qp,
              failback ? "sent nothing on fake0 after its port came back (no failback)"
                       : "completed nothing posted after the cut (no failover)",
              WAIT_MS);
      return -1;
    }
    sched_yield();
  }
  return 0;
}

/* Even cycles: at least NQP QPs in RTS on each of fake1 and fake3 (the shim's standby QPs of
   both ends connected again after the failback), within WAIT_MS. */
static int wait_standby_rearmed(int cycle) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  for (;;) {
    int ready[2] = {0, 0};
    for (int side = 0; side < 2; ++side) {
      uint32_t qps[64];
      const int n = fake_list_qps(side == 0 ? 1 : 3, qps, 64);
      for (int i = 0; i < n && i < 64; ++i) {
        struct fake_verbs_qp_stats st;
        if (fake_qp_stats(qps[i], &st) == 0 && st.qp_state == IBV_QPS_RTS) ++ready[side];
      }
    }
    if (ready[0] >= NQP && ready[1] >= NQP) return 0;
    if (atomic_load(&g_fails)) return -1;
    if (now_ms() > deadline) {
      failure("cycle %d: the standby QPs were not connected again within %d ms (RTS: %d on "
              "fake1, %d on fake3)", cycle, WAIT_MS, ready[0], ready[1]);
      return -1;
    }
    sched_yield();
  }
}

static int all_complete(void) {
  for (int qp = 0; qp < NQP; ++qp) {
    const int sent = atomic_load(&g_sent[qp]);
    /* the last message may be unsignaled: the last signaled one proves everything before it */
    int last_signaled = sent - 1;
    while (last_signaled >= 0 && !signaled(last_signaled)) --last_signaled;
    if (atomic_load(&g_done[qp]) < last_signaled + 1) return 0;
  }
  return atomic_load(&g_receptions) == (long long)atomic_load(&g_sent[0]) +
                                           atomic_load(&g_sent[1]) + atomic_load(&g_sent[2]) +
                                           atomic_load(&g_sent[3]);
}

static void final_checks(void) {
  for (int qp = 0; qp < NQP; ++qp) {
    const int sent = atomic_load(&g_sent[qp]);
    if (g_received[qp] != sent) failure("B got %d of the %d messages on qp %d", g_received[qp], sent, qp);
    for (int seq = 0; seq < sent; ++seq)
      if (signaled(seq) && !atomic_load(&g_seen[qp][seq]))
        failure("A: signaled message %d on qp %d never completed", seq, qp);
  }
  /* Nothing more may arrive: a late duplicate would show here. */
  for (int i = 0; i < 400 && !atomic_load(&g_fails); ++i) {
    fake_progress();
    struct ibv_wc wc;
    if (ibv_poll_cq(g_a.cq, 1, &wc) > 0 || ibv_poll_cq(g_b.cq, 1, &wc) > 0)
      failure("a completion after the end: qp %u wr_id %#llx status %s", wc.qp_num,
              (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2 || strcmp(argv[1], "cut_heal_cycles") != 0) {
    fprintf(stderr, "usage: %s cut_heal_cycles\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  fake_port_down = (int (*)(int))fake_sym("fake_verbs_port_down");
  fake_port_up = (int (*)(int))fake_sym("fake_verbs_port_up");
  fake_list_qps = (int (*)(int, uint32_t*, int))fake_sym("fake_verbs_list_qps");
  fake_qp_stats = (int (*)(uint32_t, struct fake_verbs_qp_stats*))fake_sym("fake_verbs_query_qp_stats");
  open_host(&g_a, "fake0");
  open_host(&g_b, "fake2");
  for (int i = 0; i < NQP; ++i) {
    if (vf_test_rc_connect(g_a.qp[i], g_b.qp[i]->qp_num, g_b.gid, 1, ACCESS) ||
        vf_test_rc_connect(g_b.qp[i], g_a.qp[i]->qp_num, g_a.gid, 1, ACCESS))
      setup_fail("connecting pair %d", i);
    for (int slot = 0; slot < RQ_DEPTH; ++slot) post_receive(i, slot);
  }
  printf("QPN A=%u B=%u\n", g_a.qp[0]->qp_num, g_b.qp[0]->qp_num);

  pthread_t posters[NQP], pollers[POLLERS], recv_thread, nic_thread;
  if (pthread_create(&nic_thread, NULL, nic, NULL) != 0 ||
      pthread_create(&recv_thread, NULL, receiver, NULL) != 0)
    setup_fail("pthread_create");
  for (int i = 0; i < POLLERS; ++i)
    if (pthread_create(&pollers[i], NULL, poller, NULL) != 0) setup_fail("pthread_create");
  for (int i = 0; i < NQP; ++i)
    if (pthread_create(&posters[i], NULL, poster, (void*)(intptr_t)i) != 0)
      setup_fail("pthread_create");

  int cycles = 0;
  for (; cycles < CYCLES && !atomic_load(&g_fails); ++cycles) {
    if (wait_traffic(atomic_load(&g_completions), atomic_load(&g_receptions), "before the cut",
                     cycles))
      break;
    if (cycles > 0 && cycles % 2 == 0 && wait_standby_rearmed(cycles)) break;
    if (fake_port_down(0) != 0) failure("fake_verbs_port_down(0) failed");
    const int failed = wait_each_qp_moved(cycles, 0);
    if (fake_port_up(0) != 0) failure("fake_verbs_port_up(0) failed");
    if (failed || wait_each_qp_moved(cycles, 1)) break;
  }

  atomic_store(&g_stop_posting, 1);
  for (int i = 0; i < NQP; ++i) pthread_join(posters[i], NULL);
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (!atomic_load(&g_fails) && !all_complete()) {
    if (now_ms() > deadline) {
      failure("the last messages did not complete within %d ms", WAIT_MS);
      break;
    }
    sched_yield();
  }
  atomic_store(&g_stop_all, 1);
  pthread_join(nic_thread, NULL);
  pthread_join(recv_thread, NULL);
  for (int i = 0; i < POLLERS; ++i) pthread_join(pollers[i], NULL);
  if (!atomic_load(&g_fails)) final_checks();

  const int fails = atomic_load(&g_fails);
  if (fails) {
    printf("FAIL: scenario %s: %d failure(s) after %d cycle(s)\n", g_scenario, fails, cycles);
    return 1;
  }
  printf("PASS scenario %s: %d cut/heal cycles of fake0, %lld signaled completions on A's "
         "shared CQ (%d pollers), %lld messages received on B in order\n", g_scenario, cycles,
         (long long)atomic_load(&g_completions), POLLERS, (long long)atomic_load(&g_receptions));
  return 0;
}
