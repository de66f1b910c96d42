/* Exactly-once across two processes: one RC QP per process, the two ends on the fake's wire
   (VF_FAKE_VERBS_WIRE: the fake fabric shared between processes, tests/fake_verbs/wire.cc), the
   two shims paired over their real TCP control channel. Run by run_two_process.sh, one process
   per host:  vf_two_process SCENARIO HOST   (HOST 0 or 1; both get the same SCENARIO).

   Each side sends N messages: an unsignaled RDMA WRITE of message i's 64-byte pattern into the
   peer's target region, then a signaled SEND_WITH_IMM(i) of 100-355 pattern bytes. The receiver
   checks every byte and order: message i arrives once, after i-1, with its payload, and its
   WRITE is already in place (RC orders them). The sender checks each SEND completes once, in
   order, with success. The cut comes a third of the way in, right after a burst of posts, so
   that work is on the wire:
     no_cut        nothing is cut (the wire and the checks are sane); host 0 forks a child
                   mid-traffic that calls a verb
     crossed_cut   both hosts take their rail 0 down at once: both shims begin a switch
     one_side_cut  host 0's rail 0 goes down; host 1 learns it from its peer or its own retries
     ack_lost_cut  host 1 executes a request of host 0 whose acknowledgement is lost, then
                   host 0's rail 0 goes down before the retry: delivered once, not again
     reply_lost    host 0's rail 0 goes down and host 1's shim loses its first FailoverReply:
                   host 0's shim asks again; every message still arrives once
     peer_dies     host 1 kills itself (SIGKILL) at the cut; once it is gone host 0 posts a
                   window and its rail 0 goes down: host 0 must end with the ordinary error (an
                   error completion), no hang, no completion twice, and no SEND of that window
                   reported delivered (host 1 died before host 0's switch began)
     peer_dies_mid_switch  host 0's rail 0 goes down; host 1's shim switches at its request,
                   its answer is lost with its session, and host 1 dies before the request comes
                   again: host 0 ends with the ordinary error, no hang, nothing completed twice
   With the shim, every scenario but peer_dies must PASS and show a failover on both hosts.
   A rendezvous socket (abstract unix, named after the fabric) carries the QP numbers and the
   phase changes, as perftest's TCP exchange does. Every wait is bounded. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/rc_connect.h"
#include "tests/fake_verbs/fake_verbs_control.h"

#define N_MESSAGES 300
#define WINDOW 24 /* messages outstanding; two WRs each */
/* Receives posted: the messages, the fence after them, and room for duplicates to arrive (and
   be caught) instead of waiting unseen for a receive. */
#define N_RECEIVES (N_MESSAGES + 1 + WINDOW)
#define BUF_SIZE (1u << 20)
#define SRC_SLOT 512u /* message i's SEND payload at i * SRC_SLOT (and its WRITE source after) */
#define RECV_BASE (512u << 10)
#define RECV_SLOT 512u
#define TGT_BASE (768u << 10) /* the peer writes message i's pattern into slot i % WRITE_SLOTS */
#define WRITE_LEN 64u
#define WRITE_SLOTS 16u /* reused: a late or repeated WRITE of an old message shows */
#define DEADLINE_S 40

static const char* g_scenario;
static int g_host;
static int g_fd = -1; /* rendezvous */
static uint8_t* g_buf;
static struct ibv_qp* g_qp;
static struct ibv_cq* g_cq;
static struct ibv_mr* g_mr;
static uint64_t g_peer_addr;
static uint32_t g_peer_rkey;
static int g_failures;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define FAIL(...)                                       \
  do {                                                  \
    printf("FAIL: [%s host %d] ", g_scenario, g_host);  \
    printf(__VA_ARGS__);                                \
    printf("\n");                                       \
    fflush(stdout);                                     \
    ++g_failures;                                       \
  } while (0)
#define SETUP(...)                  \
  do {                              \
    printf("SETUP: ");              \
    printf(__VA_ARGS__);            \
    printf("\n");                   \
    exit(2);                        \
  } while (0)

static uint8_t pattern(uint32_t msg, uint32_t byte, int from_host) {
  return (uint8_t)(msg * 31u + byte * 7u + (uint32_t)from_host * 101u + 1u);
}
static uint32_t send_len(uint32_t msg) { return 100u + (msg * 37u) % 256u; }
/* ack_lost_cut: the first message of the burst before the cut is a SEND alone, so that the
   acknowledgement lost is a SEND's (a repeated WRITE would place the same bytes again). */
static int has_write(uint32_t msg) {
  return strcmp(g_scenario, "ack_lost_cut") != 0 || msg != N_MESSAGES / 3;
}

/* ------------------------------------------------------------------ rendezvous */

static socklen_t rendezvous_address(struct sockaddr_un* a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const char* fabric = getenv("VF_FAKE_VERBS_WIRE");
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "vf-two-process/%.60s",
                   fabric ? fabric : "");
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void rendezvous(void) {
  struct sockaddr_un a;
  socklen_t len = rendezvous_address(&a);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) SETUP("socket: %s", strerror(errno));
  if (g_host == 0) {
    if (bind(fd, (struct sockaddr*)&a, len) != 0 || listen(fd, 1) != 0)
      SETUP("rendezvous bind: %s", strerror(errno));
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20000) != 1) SETUP("host 1 did not come within 20 s");
    g_fd = accept(fd, NULL, NULL);
    close(fd);
    if (g_fd < 0) SETUP("accept: %s", strerror(errno));
    return;
  }
  /* Host 0 may not listen yet: a bounded number of tries, each a refused connect. */
  for (int tries = 0; tries < 4000; ++tries) {
    if (connect(fd, (struct sockaddr*)&a, len) == 0) {
      g_fd = fd;
      return;
    }
    struct timespec pause = {0, 5 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  SETUP("host 0's rendezvous did not appear within 20 s");
}

static void exchange(const void* mine, void* theirs, size_t len) {
  if (write(g_fd, mine, len) != (ssize_t)len) SETUP("rendezvous write: %s", strerror(errno));
  size_t got = 0;
  while (got < len) {
    struct pollfd p = {g_fd, POLLIN, 0};
    if (poll(&p, 1, 30000) != 1) SETUP("the peer said nothing for 30 s");
    ssize_t n = read(g_fd, (char*)theirs + got, len - got);
    if (n <= 0) SETUP("the peer closed the rendezvous");
    got += (size_t)n;
  }
}

static void phase(char tag) {
  char theirs = 0;
  exchange(&tag, &theirs, 1);
  if (theirs != tag) SETUP("phase '%c' met '%c'", tag, theirs);
}

static uint32_t g_burst_first = UINT32_MAX; /* the first message posted right before the cut */

/* peer_dies on host 0: the burst goes only once host 1 is dead (its end of the rendezvous
   closed by the kernel), so that no SEND of it can have been delivered. */
static void wait_peer_gone(void) {
  struct pollfd p = {g_fd, POLLIN, 0};
  char c;
  if (poll(&p, 1, 10000) != 1 || recv(g_fd, &c, 1, 0) != 0) SETUP("host 1 did not die within 10 s");
  printf("host 1 is gone\n");
}

/* True once the peer closed the rendezvous (it ended): no wait for a deadline then. */
static int peer_ended(void) {
  struct pollfd p = {g_fd, POLLIN, 0};
  if (poll(&p, 1, 0) != 1) return 0;
  char c;
  return recv(g_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* ------------------------------------------------------------------ traffic */

static uint32_t g_posted, g_completed, g_received;

static void post_message(uint32_t i) {
  uint8_t* src = g_buf + i * SRC_SLOT;
  uint32_t len = send_len(i);
  for (uint32_t b = 0; b < len; ++b) src[b] = pattern(i, b, g_host);
  struct ibv_sge write_sge = {(uintptr_t)src, WRITE_LEN, g_mr->lkey};
  struct ibv_sge send_sge = {(uintptr_t)src, len, g_mr->lkey};
  struct ibv_send_wr send_wr, write_wr, *bad = NULL;
  memset(&write_wr, 0, sizeof write_wr);
  write_wr.wr_id = 0x1000000u + i;
  write_wr.opcode = IBV_WR_RDMA_WRITE;
  write_wr.sg_list = &write_sge;
  write_wr.num_sge = 1;
  write_wr.wr.rdma.remote_addr = g_peer_addr + TGT_BASE + (uint64_t)(i % WRITE_SLOTS) * WRITE_LEN;
  write_wr.wr.rdma.rkey = g_peer_rkey;
  write_wr.next = &send_wr;
  memset(&send_wr, 0, sizeof send_wr);
  send_wr.wr_id = i;
  send_wr.opcode = IBV_WR_SEND_WITH_IMM;
  send_wr.imm_data = htonl(i);
  send_wr.send_flags = IBV_SEND_SIGNALED;
  send_wr.sg_list = &send_sge;
  send_wr.num_sge = 1;
  int err = ibv_post_send(g_qp, has_write(i) ? &write_wr : &send_wr, &bad);
  if (err != 0) FAIL("ibv_post_send of message %u: %s", i, strerror(err));
  ++g_posted;
}

static void check_receive(const struct ibv_wc* wc) {
  uint32_t i = ntohl(wc->imm_data);
  if (wc->wr_id != g_received) {
    FAIL("receive completion for slot %llu, expected slot %u", (unsigned long long)wc->wr_id,
         g_received);
  }
  if (!(wc->wc_flags & IBV_WC_WITH_IMM) || i != g_received) {
    FAIL("message %u arrived where message %u was due (lost, repeated or reordered)", i,
         g_received);
    ++g_received;
    return;
  }
  const uint8_t* slot = g_buf + RECV_BASE + (uint64_t)(wc->wr_id % 512u) * RECV_SLOT;
  if (wc->byte_len != send_len(i)) FAIL("message %u: %u bytes, sent %u", i, wc->byte_len, send_len(i));
  for (uint32_t b = 0; b < send_len(i) && b < wc->byte_len; ++b) {
    if (slot[b] != pattern(i, b, 1 - g_host)) {
      FAIL("message %u: byte %u is 0x%02x, sent 0x%02x", i, b, slot[b], pattern(i, b, 1 - g_host));
      break;
    }
  }
  /* Its WRITE is in place, or a later one into the same slot (the sender runs ahead of this
     poll); never an older one. */
  const uint8_t* written = g_buf + TGT_BASE + (uint64_t)(i % WRITE_SLOTS) * WRITE_LEN;
  int seen = !has_write(i);
  for (uint32_t j = i; j <= N_MESSAGES && !seen; j += WRITE_SLOTS) {
    seen = 1;
    for (uint32_t b = 0; b < WRITE_LEN && seen; ++b) seen = written[b] == pattern(j, b, 1 - g_host);
  }
  if (!seen) FAIL("message %u arrived before its RDMA WRITE, or an older WRITE landed after it", i);
  ++g_received;
}

/* Polls once; returns the number of error completions seen. */
static int poll_once(int* errors_seen) {
  struct ibv_wc wc[16];
  int n = ibv_poll_cq(g_cq, 16, wc);
  if (n < 0) FAIL("ibv_poll_cq: %d", n);
  for (int k = 0; k < n; ++k) {
    if (wc[k].status != IBV_WC_SUCCESS) {
      ++*errors_seen;
      if (*errors_seen <= 3)
        printf("error completion: wr_id 0x%llx %s\n", (unsigned long long)wc[k].wr_id,
               ibv_wc_status_str(wc[k].status));
      if (wc[k].opcode & IBV_WC_RECV) continue;
      if (wc[k].wr_id < 0x1000000u) ++g_completed; /* a SEND ended, in error */
      continue;
    }
    if (wc[k].opcode & IBV_WC_RECV) {
      check_receive(&wc[k]);
    } else if (wc[k].wr_id >= 0x1000000u) {
      FAIL("a completion for the unsignaled WRITE 0x%llx", (unsigned long long)wc[k].wr_id);
    } else if (strcmp(g_scenario, "peer_dies") == 0 && wc[k].wr_id >= g_burst_first) {
      FAIL("SEND %llu, posted after the peer died, completed with success",
           (unsigned long long)wc[k].wr_id);
    } else if (wc[k].wr_id != g_completed) {
      FAIL("SEND %llu completed where SEND %u was due (twice, lost or out of order)",
           (unsigned long long)wc[k].wr_id, g_completed);
      g_completed = (uint32_t)wc[k].wr_id + 1;
    } else {
      ++g_completed;
    }
  }
  return n;
}

/* ------------------------------------------------------------------ set-up */

struct endpoint {
  uint32_t qpn;
  union ibv_gid gid;
  uint64_t addr;
  uint32_t rkey;
};

static void set_up(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (list == NULL || n < 1) SETUP("no device");
  struct ibv_context* ctx = ibv_open_device(list[0]); /* this host's rail 0 */
  if (ctx == NULL) SETUP("ibv_open_device");
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  g_buf = aligned_alloc(4096, BUF_SIZE);
  if (pd == NULL || g_buf == NULL) SETUP("PD or buffer");
  memset(g_buf, 0, BUF_SIZE);
  g_mr = ibv_reg_mr(pd, g_buf, BUF_SIZE,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  g_cq = ibv_create_cq(ctx, 4 * N_RECEIVES, NULL, NULL, 0);
  if (g_mr == NULL || g_cq == NULL) SETUP("MR or CQ");
  struct ibv_qp_init_attr qa;
  memset(&qa, 0, sizeof qa);
  qa.send_cq = qa.recv_cq = g_cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 2 * WINDOW + 8;
  qa.cap.max_recv_wr = N_RECEIVES + 8;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  g_qp = ibv_create_qp(pd, &qa);
  if (g_qp == NULL) SETUP("ibv_create_qp: %s", strerror(errno));
  struct endpoint mine = {g_qp->qp_num, {{0}}, (uintptr_t)g_buf, g_mr->rkey}, theirs;
  if (ibv_query_gid(ctx, 1, 1, &mine.gid) != 0) SETUP("ibv_query_gid");
  rendezvous();
  exchange(&mine, &theirs, sizeof mine);
  g_peer_addr = theirs.addr;
  g_peer_rkey = theirs.rkey;
  for (uint32_t i = 0; i < N_RECEIVES; ++i) {
    struct ibv_sge sge = {(uintptr_t)(g_buf + RECV_BASE + (uint64_t)i * RECV_SLOT), RECV_SLOT,
                          g_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    if (i == 0 && vf_test_rc_to_init(g_qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ))
      SETUP("INIT");
    if (ibv_post_recv(g_qp, &wr, &bad) != 0) SETUP("ibv_post_recv");
  }
  if (vf_test_rc_to_rtr(g_qp, theirs.qpn, theirs.gid, 1) || vf_test_rc_to_rts(g_qp))
    SETUP("connect: %s", strerror(errno));
  printf("QPN %u peer %u\n", g_qp->qp_num, theirs.qpn);
  ibv_free_device_list(list);
}

/* With the shim: waits (bounded) until it protects the QP, so the cut tests a failover. */
static int (*g_protected)(uint32_t, char*, size_t);
static int (*g_switches)(uint32_t, unsigned long*, unsigned long*);

static void wait_protected(void) {
  g_protected = (int (*)(uint32_t, char*, size_t))dlsym(RTLD_DEFAULT,
                                                       "verbs_failover_debug_qp_protected");
  g_switches = (int (*)(uint32_t, unsigned long*, unsigned long*))dlsym(
      RTLD_DEFAULT, "verbs_failover_debug_qp_switches");
  if (g_protected == NULL) return; /* no shim */
  char why[256] = "";
  double until = now_s() + 20;
  while (g_protected(g_qp->qp_num, why, sizeof why) != 1) {
    /* The pairing runs on the shim's thread; polling the CQ here is what an application does. */
    int errors = 0;
    poll_once(&errors);
    if (errors > 0) SETUP("an error completion before any traffic");
    if (now_s() > until) SETUP("the shim did not protect QP %u within 20 s: %s", g_qp->qp_num, why);
  }
}

static void drain_window(void) {
  double until = now_s() + 10;
  while (g_completed < g_posted) {
    int errors = 0;
    poll_once(&errors);
    if (errors > 0) FAIL("an error completion reached the application");
    if (now_s() > until) SETUP("the window did not drain within 10 s");
  }
}

/* reply_lost on host 1: its shim's next FailoverReply is lost (verbs_failover_debug_lose_control);
   host 0's shim must ask again and get the same answer, with nothing done twice. */
static int (*g_lose_control)(const char*, unsigned);

static void lose_next_reply(void) {
  g_lose_control =
      (int (*)(const char*, unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_lose_control");
  if (g_lose_control == NULL) return; /* no shim: nothing to lose */
  if (g_lose_control("FailoverReply", 1) != 1) SETUP("verbs_failover_debug_lose_control");
}

/* After both ends are done: one more message each way. RC keeps order, so a duplicate of any
   earlier message would arrive before it (and fail the order check); then every WRITE slot must
   hold the last message that used it. */
static void fence(void) {
  post_message(N_MESSAGES);
  double until = now_s() + 10;
  while ((g_completed < N_MESSAGES + 1 || g_received < N_MESSAGES + 1) && g_failures == 0) {
    int errors = 0;
    poll_once(&errors);
    if (errors > 0) FAIL("an error completion reached the application");
    if (now_s() > until) FAIL("the fence message did not arrive within 10 s");
  }
  for (uint32_t slot = 0; slot < WRITE_SLOTS && g_failures == 0; ++slot) {
    uint32_t last = N_MESSAGES - WRITE_SLOTS + 1 + ((slot - (N_MESSAGES - WRITE_SLOTS + 1) % WRITE_SLOTS + WRITE_SLOTS) % WRITE_SLOTS);
    const uint8_t* written = g_buf + TGT_BASE + (uint64_t)slot * WRITE_LEN;
    for (uint32_t b = 0; b < WRITE_LEN; ++b) {
      if (written[b] != pattern(last, b, 1 - g_host)) {
        FAIL("WRITE slot %u does not hold message %u's bytes at the end (a late WRITE?)", slot, last);
        break;
      }
    }
  }
}

/* no_cut on host 0, mid-traffic: a child (a DataLoader worker, say) is forked and calls a verb.
   It must not hang (the fake's wire thread parks around fork, the shim's handlers run), nor
   take the parent's traffic: the parent's run goes on, checked to the last byte. */
static void fork_a_child(void) {
  pid_t child = fork();
  if (child < 0) SETUP("fork: %s", strerror(errno));
  if (child == 0) {
    int n = 0;
    struct ibv_device** list = ibv_get_device_list(&n);
    if (list != NULL) ibv_free_device_list(list);
    _exit(list != NULL && n == 2 ? 0 : 3);
  }
  double until = now_s() + 10;
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    int errors = 0;
    poll_once(&errors);
    if (errors > 0) FAIL("an error completion reached the application");
    if (now_s() > until) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL("a forked child did not end within 10 s (a verb hung in it)");
      return;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    FAIL("the forked child's verb failed (status 0x%x)", status);
  else
    printf("fork: a child called a verb and ended\n");
}

static int g_ack_lost; /* ack_lost_cut on host 0: the next acknowledgement to fake0 is lost */
static int (*g_dev_stats)(int, struct fake_verbs_device_stats*);
static uint64_t g_acks_lost_before;

static void lose_next_ack(void) {
  int (*lose_acks)(int, unsigned) =
      (int (*)(int, unsigned))dlvsym(RTLD_DEFAULT, "fake_verbs_set_lose_acks", "FAKE_VERBS_1.0");
  g_dev_stats = (int (*)(int, struct fake_verbs_device_stats*))dlvsym(
      RTLD_DEFAULT, "fake_verbs_query_device_stats", "FAKE_VERBS_1.0");
  struct fake_verbs_device_stats before;
  if (lose_acks == NULL || g_dev_stats == NULL || g_dev_stats(0, &before) != 0 ||
      lose_acks(0, 1) != 0)
    SETUP("fake_verbs_set_lose_acks");
  g_acks_lost_before = before.acks_lost;
  g_ack_lost = 1;
}

static void cut(void) {
  int (*port_down)(int) = (int (*)(int))dlvsym(RTLD_DEFAULT, "fake_verbs_port_down",
                                               "FAKE_VERBS_1.0");
  if (port_down == NULL) SETUP("not the fake libibverbs");
  int crossed = strcmp(g_scenario, "crossed_cut") == 0;
  if (strcmp(g_scenario, "peer_dies") == 0 && g_host == 1) {
    printf("cut: host 1 dies\n");
    fflush(stdout);
    raise(SIGKILL);
  }
  if (strcmp(g_scenario, "peer_dies_mid_switch") == 0 && g_host == 1) {
    /* Host 0's shim asks this one to switch; this one does, its answer is lost (its session
       cut), and it dies before host 0 asks again. */
    unsigned long over = 0;
    double until = now_s() + 10;
    while (g_switches == NULL || g_switches(g_qp->qp_num, &over, NULL) < 0 || over == 0) {
      int errors = 0;
      poll_once(&errors);
      if (g_switches == NULL || now_s() > until) SETUP("host 0's switch did not reach host 1 in 10 s");
    }
    printf("cut: host 1 switched at its peer's request, dies before its answer arrives\n");
    fflush(stdout);
    raise(SIGKILL);
  }
  if (g_ack_lost) {
    /* The acknowledgement of the SEND host 1 executed is lost; the cut comes before the retry:
       host 0 never learns that it was delivered. */
    struct fake_verbs_device_stats now;
    double until = now_s() + 5;
    do {
      int errors = 0; /* the application keeps polling, as it would */
      poll_once(&errors);
      if (errors > 0) FAIL("an error completion reached the application");
      if (g_dev_stats(0, &now) != 0 || now_s() > until)
        SETUP("no acknowledgement was lost in 5 s (%u posted, %u completed)", g_posted, g_completed);
    } while (now.acks_lost == g_acks_lost_before);
    printf("cut: the acknowledgement of SEND %u lost\n", N_MESSAGES / 3);
    fflush(stdout);
  }
  if (g_host == 0 || crossed) {
    if (port_down(2 * g_host) != 0) SETUP("fake_verbs_port_down(%d)", 2 * g_host);
    printf("cut: fake%d port down\n", 2 * g_host);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s no_cut|crossed_cut|one_side_cut|ack_lost_cut|reply_lost|peer_dies|peer_dies_mid_switch 0|1\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  g_host = atoi(argv[2]);
  setvbuf(stdout, NULL, _IOLBF, 0);
  set_up();
  wait_protected();
  phase('T'); /* both protected: traffic */
  const int cuts = strcmp(g_scenario, "no_cut") != 0;
  const int dies = strncmp(g_scenario, "peer_dies", 9) == 0;
  int errors = 0, cut_done = !cuts, forked = 0;
  double deadline = now_s() + DEADLINE_S;
  while ((g_completed < N_MESSAGES || g_received < N_MESSAGES) && g_failures == 0) {
    if (!cut_done && g_posted >= N_MESSAGES / 3) {
      /* Both windows empty, then both post a full one and cut: the cut meets work on the wire. */
      drain_window();
      if ((strcmp(g_scenario, "reply_lost") == 0 || strcmp(g_scenario, "peer_dies_mid_switch") == 0) &&
          g_host == 1)
        lose_next_reply();
      phase('C');
      if (strcmp(g_scenario, "ack_lost_cut") == 0 && g_host == 0) lose_next_ack();
      if (strcmp(g_scenario, "peer_dies") == 0 && g_host == 0) wait_peer_gone();
      g_burst_first = g_posted;
      while (g_posted < N_MESSAGES && g_posted - g_completed < WINDOW) post_message(g_posted);
      cut();
      cut_done = 1;
    }
    while (g_posted < N_MESSAGES && g_posted - g_completed < WINDOW &&
           (cut_done || g_posted < N_MESSAGES / 3))
      post_message(g_posted);
    poll_once(&errors);
    if (!cuts && g_host == 0 && !forked && g_posted >= N_MESSAGES / 2) {
      fork_a_child();
      forked = 1;
    }
    if (!dies && peer_ended()) FAIL("the peer process ended before the traffic did");
    if (errors > 0 && !dies) FAIL("an error completion reached the application");
    if (dies && errors > 0 && g_completed == g_posted) break; /* the survivor's ordinary end */
    if (now_s() > deadline) {
      FAIL("no end after %d s: %u of %u SENDs completed, %u of %u messages received", DEADLINE_S,
           g_completed, N_MESSAGES, g_received, N_MESSAGES);
      break;
    }
  }
  if (dies) {
    if (g_failures == 0 && errors == 0) FAIL("the peer died and no error reached the application");
    if (g_failures) return 1;
    printf("PASS scenario %s: %u SENDs completed (%d error completions), %u received\n",
           g_scenario, g_completed, errors, g_received);
    return 0;
  }
  if (g_failures == 0) {
    phase('D');
    fence();
  }
  if (g_lose_control != NULL && g_lose_control("FailoverReply", 0) != 0)
    FAIL("this shim never sent a FailoverReply: no reply was lost, the scenario proves nothing");
  if (g_switches != NULL) {
    unsigned long over = 0, back = 0;
    int path = g_switches(g_qp->qp_num, &over, &back);
    printf("stats: qp %u path=%d failovers=%lu failbacks=%lu\n", g_qp->qp_num, path, over, back);
    if (cuts && over < 1) FAIL("no failover counted on this host");
    if (!cuts && over > 0) FAIL("a failover without a cut");
  }
  if (g_failures) return 1;
  printf("PASS scenario %s: %u SENDs completed, %u messages received, every byte checked\n",
         g_scenario, g_completed, g_received);
  return 0;
}
