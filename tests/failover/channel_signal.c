/* A signal during a blocking ibv_get_cq_event, on the FAKE libibverbs, with or without the shim:
   it must behave the same. libibverbs waits in a read() of the channel's event file, so a signal
   whose handler lacks SA_RESTART ends the wait with EINTR (how Python's Ctrl-C, or a program's
   own timer, gets a thread out of it), and one whose handler has SA_RESTART does not (the read
   restarts). The shim waits in poll() on the channel's replaced fd, which a signal always ends.

   A thread blocks in ibv_get_cq_event on a blocking channel of fake0; the main thread signals it
   (SIGUSR1) again and again until it returns, within WAIT_MS (a signal that comes before the call
   only runs the handler: the next one finds the thread inside):
   - interrupt: the handler has no SA_RESTART: the call must return -1 with errno EINTR;
   - restart: the handler has SA_RESTART: after RESTART_SIGNALS handled signals the call must
     still be waiting; then a signaled RDMA WRITE to fake2 completes on the channel's CQ and the
     call must return that CQ's event.

   Usage: channel_signal interrupt|restart
   Output: "PASS scenario ..." and exit 0; "FAIL: [...]" and exit 1; "SETUP:" and exit 3. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/common/rc_connect.h"
#include "tests/common/scenario_report.h"

#define WAIT_MS 10000
#define RESTART_SIGNALS 20
#define BUF_SIZE 4096
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static atomic_int g_handled;  /* signals the handler ran for */
static atomic_int g_returned; /* the waiting thread is out of ibv_get_cq_event */
static int g_result, g_errno;
static struct ibv_cq* g_event_cq;
static struct ibv_comp_channel* g_channel;

static void on_signal(int sig) {
  (void)sig;
  atomic_fetch_add(&g_handled, 1);
}

static void* waiter(void* arg) {
  (void)arg;
  void* context = NULL;
  g_result = ibv_get_cq_event(g_channel, &g_event_cq, &context);
  g_errno = errno;
  atomic_store(&g_returned, 1);
  return NULL;
}

/* Signals the waiting thread until `until` holds or WAIT_MS pass; 0 when it held. */
static int signal_until(pthread_t thread, int (*until)(void)) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  while (!until()) {
    if (now_ms() > deadline) return -1;
    const int handled = atomic_load(&g_handled);
    pthread_kill(thread, SIGUSR1);
    while (atomic_load(&g_handled) == handled && !atomic_load(&g_returned) && now_ms() < deadline)
      sched_yield();
  }
  return 0;
}

static int returned(void) { return atomic_load(&g_returned); }
static int enough_signals(void) {
  return atomic_load(&g_returned) || atomic_load(&g_handled) >= RESTART_SIGNALS;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2 || (strcmp(argv[1], "interrupt") != 0 && strcmp(argv[1], "restart") != 0)) {
    fprintf(stderr, "usage: %s interrupt|restart\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  const int restart = strcmp(argv[1], "restart") == 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = restart ? SA_RESTART : 0;
  if (sigaction(SIGUSR1, &sa, NULL) != 0) setup_fail("sigaction");

  struct ibv_context* ctx = open_device_named("fake0");
  struct ibv_context* peer_ctx = open_device_named("fake2");
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_pd* peer_pd = ibv_alloc_pd(peer_ctx);
  uint8_t *buf = NULL, *peer_buf = NULL;
  struct ibv_mr* mr = register_zeroed_buffer(pd, BUF_SIZE, ACCESS, &buf);
  struct ibv_mr* peer_mr = register_zeroed_buffer(peer_pd, BUF_SIZE, ACCESS, &peer_buf);
  g_channel = ibv_create_comp_channel(ctx);
  if (!g_channel) setup_fail("ibv_create_comp_channel");
  struct ibv_cq* cq = ibv_create_cq(ctx, 16, NULL, g_channel, 0);
  struct ibv_cq* peer_cq = ibv_create_cq(peer_ctx, 16, NULL, NULL, 0);
  if (!cq || !peer_cq) setup_fail("ibv_create_cq");
  struct ibv_qp_init_attr attr = {
      .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = ibv_create_qp(pd, &attr);
  attr.send_cq = attr.recv_cq = peer_cq;
  struct ibv_qp* peer_qp = ibv_create_qp(peer_pd, &attr);
  union ibv_gid gid, peer_gid;
  if (!qp || !peer_qp || ibv_query_gid(ctx, 1, 1, &gid) || ibv_query_gid(peer_ctx, 1, 1, &peer_gid))
    setup_fail("QPs or GIDs");
  if (vf_test_rc_connect(qp, peer_qp->qp_num, peer_gid, 1, ACCESS) ||
      vf_test_rc_connect(peer_qp, qp->qp_num, gid, 1, ACCESS))
    setup_fail("connecting");
  if (ibv_req_notify_cq(cq, 0) != 0) setup_fail("ibv_req_notify_cq");

  pthread_t thread;
  if (pthread_create(&thread, NULL, waiter, NULL) != 0) setup_fail("pthread_create");
  if (!restart) {
    if (signal_until(thread, returned) != 0) {
      fail("ibv_get_cq_event did not return within %d ms of %d signal(s) whose handler has no "
           "SA_RESTART", WAIT_MS, atomic_load(&g_handled));
      return 1; /* the thread is still blocked: no join */
    }
    pthread_join(thread, NULL);
    if (g_result != -1 || g_errno != EINTR)
      fail("ibv_get_cq_event returned %d (errno %d), expected -1 with EINTR", g_result, g_errno);
  } else {
    if (signal_until(thread, enough_signals) != 0) setup_fail("signals not handled");
    if (atomic_load(&g_returned))
      fail("ibv_get_cq_event returned %d (errno %d) on a signal whose handler has SA_RESTART",
           g_result, g_errno);
    struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {(uintptr_t)peer_buf, peer_mr->rkey}};
    struct ibv_send_wr* bad = NULL;
    if (!g_failures && ibv_post_send(qp, &wr, &bad) != 0) setup_fail("ibv_post_send");
    const uint64_t deadline = now_ms() + WAIT_MS;
    while (!g_failures && !atomic_load(&g_returned) && now_ms() < deadline) sched_yield();
    if (!atomic_load(&g_returned)) {
      fail("no CQ event within %d ms of a signaled completion", WAIT_MS);
      return 1;
    }
    pthread_join(thread, NULL);
    if (!g_failures && (g_result != 0 || g_event_cq != cq))
      fail("ibv_get_cq_event returned %d (errno %d), cq %p; expected the event of cq %p",
           g_result, g_errno, (void*)g_event_cq, (void*)cq);
    if (g_result == 0) ibv_ack_cq_events(cq, 1);
  }
  if (g_failures) {
    printf("FAIL: scenario %s: %d failure(s)\n", g_scenario, g_failures);
    return 1;
  }
  printf("PASS scenario %s: %d signal(s) handled, ibv_get_cq_event returned %d%s\n", g_scenario,
         atomic_load(&g_handled), g_result, g_result ? " (EINTR)" : " (the CQ's event)");
  return 0;
}
