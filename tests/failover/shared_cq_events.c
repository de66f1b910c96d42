/* One QP cut while another on the same CQ stays healthy, with the program waiting on the CQ's
   completion channel (issue 19, "event-driven variants"), on the FAKE libibverbs
   (docs/fake_verbs.md), with or without the shim.

   Host A (fake0, backed up by fake1) has two RC QPs whose sends and receives complete on ONE CQ
   with ONE completion channel: QP AB to host B (fake2, backed up by fake3) and QP AC to host C
   (fake4, backed up by fake5). A waits only as an event-driven program does (rsockets, UCX and
   libfabric progress threads): epoll on the channel's fd, then ibv_get_cq_event until EAGAIN,
   ibv_ack_cq_events, ibv_req_notify_cq, ibv_poll_cq until it returns 0. It never polls
   otherwise (its epoll_wait has timeout 0: the same loop drives the fake's progress, so the
   thread never blocks; what is checked is that the fd says when to poll). B and C busy-poll their own CQs (how other hosts wait does not matter here).

   Every round each of B and C sends A one message and A sends each of them one. At round CUT
   B's rail 0 fails (port_down: its port goes down; drop: it silently drops every packet, no
   event), so only QP AB loses its path: with the shim it moves to A's and B's second rails
   while QP AC goes on on fake0 untouched, and A's single channel must wake for completions of
   both paths. At round HEAL the rail comes back (after port_down the shim fails back; after a
   silent cut it holds the path down). Checked: every completion once, in RC order per QP, with
   status SUCCESS; every message's bytes; A woke only through its channel; QP AC's traffic all
   went over its own QPs on fake0/fake4 (the fake's counters), nothing more arrives at the end.

   Usage: shared_cq_events port_down | shared_cq_events drop --silent-cut
   (--silent-cut only tells run_exactly_once.sh to check that the pair was held on its standby)
   Output: "QPN A=<AB> B=<BA>" (the pair that must fail over, for run_exactly_once.sh), then
   "PASS scenario ..." and exit 0; "FAIL: [...]" lines and exit 1; "SETUP:" and exit 3. Every
   wait is bounded; the fake's progress (fake_verbs_progress) stands in for the NICs working. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "tests/common/rc_connect.h"
#include "tests/common/scenario_report.h"

#define ROUNDS 60
#define CUT 20
#define HEAL 40
#define MSG_LEN 96
#define BUF_SIZE (64u << 10)
#define RECV_BASE (BUF_SIZE / 2) /* receive slots: one per round and peer, never reused */
#define WAIT_MS 15000
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define SEND_WR(peer, round) (0x10000u * (uint64_t)(peer + 1) + (uint64_t)(round))
#define RECV_WR(peer, round) (0x80000000u + SEND_WR(peer, round))

static void (*fake_progress)(void);
static int (*fake_port_down)(int), (*fake_port_up)(int), (*fake_set_drop)(int, int);
static int (*fake_qp_stats)(uint32_t, struct fake_verbs_qp_stats*);

struct host {
  const char* name;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  uint8_t* buf;
  struct ibv_mr* mr;
  struct ibv_comp_channel* channel; /* A only */
  struct ibv_cq* cq;
  union ibv_gid gid;
};

/* One end of a connection: its QP and what it has sent and received so far. On A, peer 0 is B
   and peer 1 is C; on B and C the end's peer index is the same as A's end of it. */
struct end {
  struct host* host;
  struct ibv_qp* qp;
  int peer;     /* 0: the A-B pair, 1: the A-C pair */
  int is_a;
  int sent;     /* sends posted */
  int got_sends, got_recvs;
};

static struct host g_host_a = {.name = "A"}, g_host_b = {.name = "B"}, g_host_c = {.name = "C"};
static struct end g_ab, g_ac, g_ba, g_ca;
static int g_epoll = -1;
static int g_events; /* CQ events A got */

static void open_host(struct host* h, const char* device, int with_channel) {
  h->ctx = open_device_named(device);
  h->pd = ibv_alloc_pd(h->ctx);
  h->mr = register_zeroed_buffer(h->pd, BUF_SIZE, ACCESS, &h->buf);
  if (with_channel) {
    h->channel = ibv_create_comp_channel(h->ctx);
    if (!h->channel) setup_fail("ibv_create_comp_channel");
    /* rsockets' way: a non-blocking fd, events taken until EAGAIN */
    const int flags = fcntl(h->channel->fd, F_GETFL);
    if (flags < 0 || fcntl(h->channel->fd, F_SETFL, flags | O_NONBLOCK) != 0)
      setup_fail("O_NONBLOCK on the channel's fd");
  }
  h->cq = ibv_create_cq(h->ctx, 128, h, h->channel, 0);
  if (!h->cq || ibv_query_gid(h->ctx, 1, 1, &h->gid) != 0)
    setup_fail("CQ or GID on %s", device);
}

static void create_end(struct end* e, struct host* h, int peer, int is_a) {
  struct ibv_qp_init_attr attr = {
      .send_cq = h->cq, .recv_cq = h->cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 16, .max_recv_wr = ROUNDS, .max_send_sge = 1, .max_recv_sge = 1}};
  e->host = h;
  e->peer = peer;
  e->is_a = is_a;
  e->qp = ibv_create_qp(h->pd, &attr);
  if (!e->qp) setup_fail("ibv_create_qp on %s", h->name);
}

static void connect_ends(struct end* x, struct end* y) {
  if (vf_test_rc_connect(x->qp, y->qp->qp_num, y->host->gid, 1, ACCESS) ||
      vf_test_rc_connect(y->qp, x->qp->qp_num, x->host->gid, 1, ACCESS))
    setup_fail("connecting %s and %s", x->host->name, y->host->name);
}

/* The receive slot of one round's message to end e (A has two peers: two slot ranges). */
static uint8_t* recv_slot(const struct end* e, int round) {
  return e->host->buf + RECV_BASE + ((size_t)e->peer * ROUNDS + (size_t)round) * MSG_LEN;
}

static uint8_t pattern(const struct end* from, int round, int k) {
  return (uint8_t)(from->is_a * 97 + from->peer * 31 + round * 7 + k);
}

static void post_recvs(struct end* e) {
  for (int r = 0; r < ROUNDS; ++r) {
    struct ibv_sge sge = {(uintptr_t)recv_slot(e, r), MSG_LEN, e->host->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = RECV_WR(e->peer, r), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr* bad = NULL;
    if (ibv_post_recv(e->qp, &wr, &bad) != 0) setup_fail("ibv_post_recv on %s", e->host->name);
  }
}

static void send_one(struct end* e) {
  const int r = e->sent;
  /* a source of its own per peer and round: nothing is overwritten while it may be replayed */
  uint8_t* src = e->host->buf + ((size_t)e->peer * ROUNDS + (size_t)r) * MSG_LEN;
  for (int k = 0; k < MSG_LEN; ++k) src[k] = pattern(e, r, k);
  struct ibv_sge sge = {(uintptr_t)src, MSG_LEN, e->host->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = SEND_WR(e->peer, r), .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr* bad = NULL;
  const int error = ibv_post_send(e->qp, &wr, &bad);
  if (error != 0) fail("%s: ibv_post_send of round %d: %s", e->host->name, r, strerror(error));
  ++e->sent;
}

static struct end* end_of(struct host* h, uint32_t qp_num) {
  struct end* all[] = {&g_ab, &g_ac, &g_ba, &g_ca};
  for (int i = 0; i < 4; ++i)
    if (all[i]->host == h && all[i]->qp->qp_num == qp_num) return all[i];
  return NULL;
}

/* One completion of host h: the next of its QP in RC order, successful, its bytes right. */
static void on_wc(struct host* h, const struct ibv_wc* wc) {
  struct end* e = end_of(h, wc->qp_num);
  if (e == NULL) {
    fail("%s: a completion of unknown qp %u (wr_id %#llx)", h->name, wc->qp_num,
         (unsigned long long)wc->wr_id);
    return;
  }
  if (wc->status != IBV_WC_SUCCESS) {
    fail("%s: wr_id %#llx on qp %u completed with %s", h->name, (unsigned long long)wc->wr_id,
         wc->qp_num, ibv_wc_status_str(wc->status));
    return;
  }
  if (wc->opcode == IBV_WC_RECV) {
    const int r = e->got_recvs++;
    if (wc->wr_id != RECV_WR(e->peer, r) || wc->byte_len != MSG_LEN) {
      fail("%s: receive #%d of qp %u is wr_id %#llx (%u bytes), expected %#llx (%u)", h->name, r,
           wc->qp_num, (unsigned long long)wc->wr_id, wc->byte_len,
           (unsigned long long)RECV_WR(e->peer, r), MSG_LEN);
      return;
    }
    const struct end* from = e->is_a ? (e->peer == 0 ? &g_ba : &g_ca) : (e->peer == 0 ? &g_ab : &g_ac);
    for (int k = 0; k < MSG_LEN; ++k) {
      if (recv_slot(e, r)[k] != pattern(from, r, k)) {
        fail("%s: byte %d of round %d's message on qp %u is %u, expected %u", h->name, k, r,
             wc->qp_num, recv_slot(e, r)[k], pattern(from, r, k));
        return;
      }
    }
    return;
  }
  const int r = e->got_sends++;
  if (wc->opcode != IBV_WC_SEND || wc->wr_id != SEND_WR(e->peer, r))
    fail("%s: send completion #%d of qp %u is wr_id %#llx opcode %d, expected %#llx", h->name, r,
         wc->qp_num, (unsigned long long)wc->wr_id, wc->opcode,
         (unsigned long long)SEND_WR(e->peer, r));
}

static int poll_host(struct host* h) {
  struct ibv_wc wc[8];
  const int n = ibv_poll_cq(h->cq, 8, wc);
  if (n < 0) {
    fail("%s: ibv_poll_cq returned %d", h->name, n);
    return 0;
  }
  for (int i = 0; i < n; ++i) on_wc(h, &wc[i]);
  return n;
}

/* A's only way to learn of completions: its channel's fd in epoll, then every event until
   EAGAIN (each acknowledged, the CQ re-armed), then ibv_poll_cq until it returns 0. */
static int a_on_channel(void) {
  struct epoll_event ev;
  const int ready = epoll_wait(g_epoll, &ev, 1, 0);
  if (ready < 0 && errno != EINTR) fail("epoll_wait: %s", strerror(errno));
  if (ready != 1) return 0;
  int got = 0;
  for (;;) {
    struct ibv_cq* cq = NULL;
    void* context = NULL;
    if (ibv_get_cq_event(g_host_a.channel, &cq, &context) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) fail("ibv_get_cq_event: %s", strerror(errno));
      break;
    }
    if (cq != g_host_a.cq || context != &g_host_a) {
      fail("ibv_get_cq_event gave cq %p context %p", (void*)cq, context);
      break;
    }
    ++g_events;
    ibv_ack_cq_events(cq, 1);
    if (ibv_req_notify_cq(cq, 0) != 0) fail("ibv_req_notify_cq");
    for (int k; (k = poll_host(&g_host_a)) > 0;) got += k;
  }
  return got;
}

static int round_done(int r) {
  const struct end* all[] = {&g_ab, &g_ac, &g_ba, &g_ca};
  for (int i = 0; i < 4; ++i)
    if (all[i]->got_sends < r + 1 || all[i]->got_recvs < r + 1) return 0;
  return 1;
}

static void wait_round(int r) {
  const uint64_t deadline = now_ms() + WAIT_MS;
  const int failures = g_failures;
  while (!round_done(r) && g_failures == failures) {
    fake_progress(); /* the NICs work by themselves while A sleeps */
    const int got = a_on_channel() + poll_host(&g_host_b) + poll_host(&g_host_c);
    if (now_ms() > deadline) {
      fail("round %d: not done within %d ms: AB sends %d recvs %d, AC sends %d recvs %d, "
           "BA sends %d recvs %d, CA sends %d recvs %d (A got %d CQ events)", r, WAIT_MS,
           g_ab.got_sends, g_ab.got_recvs, g_ac.got_sends, g_ac.got_recvs, g_ba.got_sends,
           g_ba.got_recvs, g_ca.got_sends, g_ca.got_recvs, g_events);
      return;
    }
    if (got == 0) sched_yield(); /* let the shim's engine thread run */
  }
}

/* Nothing more may arrive at the end: a late duplicate or a stray completion would show here.
   A's CQ is also polled directly now (after its last wake-up nothing may be left in it). */
static void quiet_window(void) {
  for (int i = 0; i < 400; ++i) {
    fake_progress();
    struct ibv_wc wc;
    struct host* hosts[] = {&g_host_a, &g_host_b, &g_host_c};
    for (int h = 0; h < 3; ++h)
      if (ibv_poll_cq(hosts[h]->cq, 1, &wc) > 0)
        fail("%s: a completion after the last round: qp %u wr_id %#llx status %s",
             hosts[h]->name, wc.qp_num, (unsigned long long)wc.wr_id,
             ibv_wc_status_str(wc.status));
    if (g_failures) return;
  }
}

/* QP AC never lost its path: all its traffic went over its own QPs (the fake's counters of the
   application's QP numbers, which with the shim are its physical QPs on fake0 and fake4). */
static void check_healthy_pair(void) {
  struct fake_verbs_qp_stats ac, ca;
  if (fake_qp_stats(g_ac.qp->qp_num, &ac) != 0 || fake_qp_stats(g_ca.qp->qp_num, &ca) != 0) {
    fail("the fake does not know QP AC or CA");
    return;
  }
  if (ac.messages_sent != ROUNDS || ca.messages_sent != ROUNDS || ac.transport_retries != 0 ||
      ca.transport_retries != 0)
    fail("the healthy pair A-C did not carry all its traffic itself: AC sent %llu, CA sent %llu "
         "of %d each; transport retries %llu/%llu", (unsigned long long)ac.messages_sent,
         (unsigned long long)ca.messages_sent, ROUNDS, (unsigned long long)ac.transport_retries,
         (unsigned long long)ca.transport_retries);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const int ok = (argc == 2 && strcmp(argv[1], "port_down") == 0) ||
                 (argc == 3 && strcmp(argv[1], "drop") == 0 && strcmp(argv[2], "--silent-cut") == 0);
  if (!ok) {
    fprintf(stderr, "usage: %s port_down | %s drop --silent-cut\n", argv[0], argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  const int silent = strcmp(argv[1], "drop") == 0;
  fake_progress = (void (*)(void))fake_sym("fake_verbs_progress");
  fake_port_down = (int (*)(int))fake_sym("fake_verbs_port_down");
  fake_port_up = (int (*)(int))fake_sym("fake_verbs_port_up");
  fake_set_drop = (int (*)(int, int))fake_sym("fake_verbs_set_drop");
  fake_qp_stats = (int (*)(uint32_t, struct fake_verbs_qp_stats*))fake_sym("fake_verbs_query_qp_stats");
  int (*device_count)(void) = (int (*)(void))fake_sym("fake_verbs_device_count");
  if (device_count() < 6) setup_fail("needs 6 fake devices (VF_FAKE_VERBS_DEVICES=6)");

  open_host(&g_host_a, "fake0", 1);
  open_host(&g_host_b, "fake2", 0);
  open_host(&g_host_c, "fake4", 0);
  create_end(&g_ab, &g_host_a, 0, 1);
  create_end(&g_ac, &g_host_a, 1, 1);
  create_end(&g_ba, &g_host_b, 0, 0);
  create_end(&g_ca, &g_host_c, 1, 0);
  connect_ends(&g_ab, &g_ba);
  connect_ends(&g_ac, &g_ca);
  post_recvs(&g_ab);
  post_recvs(&g_ac);
  post_recvs(&g_ba);
  post_recvs(&g_ca);
  printf("QPN A=%u B=%u\n", g_ab.qp->qp_num, g_ba.qp->qp_num);
  g_epoll = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN};
  if (g_epoll < 0 || epoll_ctl(g_epoll, EPOLL_CTL_ADD, g_host_a.channel->fd, &ev) != 0)
    setup_fail("epoll on the channel's fd");
  if (ibv_req_notify_cq(g_host_a.cq, 0) != 0) setup_fail("ibv_req_notify_cq");

  for (int r = 0; r < ROUNDS && g_failures == 0; ++r) {
    send_one(&g_ba);
    send_one(&g_ab);
    send_one(&g_ca);
    send_one(&g_ac);
    if (r == CUT && (silent ? fake_set_drop(2, 1) : fake_port_down(2)) != 0)
      setup_fail("cutting fake2");
    if (r == HEAL && (silent ? fake_set_drop(2, 0) : fake_port_up(2)) != 0)
      setup_fail("healing fake2");
    wait_round(r);
  }
  if (g_failures == 0) quiet_window();
  if (g_failures == 0) check_healthy_pair();
  if (g_failures) {
    printf("FAIL: scenario %s: %d failure(s)\n", g_scenario, g_failures);
    return 1;
  }
  printf("PASS scenario %s: %d rounds both ways on two QPs sharing A's CQ, B's rail 0 %s at "
         "round %d and back at %d; A woke %d times on its channel\n", g_scenario, ROUNDS,
         silent ? "silently dropped" : "down", CUT, HEAL, g_events);
  return 0;
}
