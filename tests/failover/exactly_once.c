/* Exactly-once failover at every interesting cut point, on the FAKE libibverbs (docs/fake_verbs.md).

   Two RC QPs in one process: A on fake0, B on fake2 (their standbys, made by the shim, live on
   fake1/fake3). A scenario runs traffic, cuts fake0's port (fake_verbs_port_down) at a precise
   point, and then checks, from the application's point of view only:
     - every signaled send WR completes exactly once, successfully, in posting order, with its
       wr_id and opcode (RDMA_READ: byte_len too); no error completion ever surfaces; every
       completion's qp_num is the application's QP;
     - every receive-consuming message (SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM) gives exactly
       one receive completion at the peer, in order, on the next posted receive (wr_id), with the
       right opcode, imm_data, byte_len and payload; when it arrives, every RDMA_WRITE posted
       before it already holds its bytes at the receiver (RC ordering, the point of WRITE_WITH_IMM);
     - at the end, RDMA_WRITE targets hold the expected bytes, and regions the receiver took over
       after a delivered message (it overwrote them with a marker) were NOT overwritten again by a
       replay; RDMA_READ destinations hold the source bytes;
     - ibv_query_qp and qp->state say RTS; no async event is pending on either context
       (non-blocking ibv_get_async_event);
     - after the cut, a fresh round of traffic in both directions works, and a quiet window of
       progress steps brings no further (duplicate) completion.
   The shim's stats file (failovers >= 1 for both QPs) is checked by run_exactly_once.sh.

   --srq: each side has one basic SRQ; A and B are attached to it, and so is a SECOND pair, A2
   (fake0) <-> B2 (fake2), that carries its own stream of sequence-numbered SENDs both ways,
   interleaved with the scenario's traffic before and after the cut (stream()). All receives are
   posted with ibv_post_srq_recv. A2/B2 share A's/B's CQs; completions are told apart by qp_num.
   A receive is then consumed by whichever QP of the SRQ gets a message, so the receive checks
   become (on_srq_recv_wc, check_srq_final): every posted receive wr_id is consumed at most once
   over the whole run, and only one of that SRQ's; each QP's messages arrive exactly once, in
   order, with the right opcode/imm/byte_len/qp_num, the payload in the buffer of the receive the
   completion names; a consumed buffer is never written again; at the end the number of consumed
   receives equals the number of receive-consuming messages of both QPs. Which receive a message
   gets (post order across the QPs) is deliberately not checked.

   --cq-ex: every CQ (A's and B's, both of them with --split-cq; A2/B2 use A's/B's) comes from
   ibv_create_cq_ex and is polled with ibv_start_poll/ibv_next_poll/ibv_end_poll, never with
   ibv_poll_cq; each completion is rebuilt into a struct ibv_wc from cq->wr_id/status and the
   ibv_wc_read_* functions for the same checker. A start..end cycle takes at most CQ_EX_BATCH (3)
   completions and is left early (end_poll without draining): the rest come in the next cycle.

   --rereg: each side allocates a second buffer; after the MRs are registered and the QPs
   connected, before any traffic, its MR is moved there with ibv_rereg_mr(CHANGE_TRANSLATION |
   CHANGE_ACCESS, same access flags). From then on everything (sources, targets, receive slots,
   memory checks, the rkey each side gives the other) uses the second buffer and the MR's new
   keys (the fake always hands out new ones). The first buffer holds a poison pattern that must be
   intact at the end (check_poison): a request replayed through a stale, pre-rereg shadow
   registration would land there (or read from there: then the peer's target is wrong).

   --resize-cq: every CQ is created with CQ_INITIAL (16) entries and, before any traffic, grown
   with ibv_resize_cq to CQ_SIZE; the scenario then runs unchanged (full_sq keeps 64 send WRs
   outstanding: a shadow CQ left at 16 entries on the backup device overflows).

   --ece: every QP, right after creation, is given ECE option 0x1 of the fake's two (ibv_set_ece,
   as an application that negotiated it with its peer does before RTR: NCCL, rdma_cm). At the end
   every QP on every fake device (the application's, and the shim's standbys) must run with
   exactly that option: a standby left at the default (0x3), or a primary the shim reset and
   reconnected without setting it again (the fake forgets ECE at RESET), is a failure.

   --rxe-flush: every fake device keeps a receive posted to a QP already in ERR until the QP is
   moved to ERR again, as rxe does (fake_verbs_set_flush_on_modify_only). The shim's drain
   marker is such a receive: the shim must move the old QP to ERR again to get it flushed, or
   its drain waits up to 1 s and logs that the device does not flush (run_exactly_once.sh fails
   a run whose shim log says so).

   Usage: exactly_once SCENARIO [--wr-api] [--sig-all] [--split-cq] [--srq] [--cq-ex] [--rereg]
                                [--resize-cq] [--ece] [--rxe-flush] [--timeout-ms N]
          exactly_once selftest      (feeds duplicates/losses/reorders to the checker itself)
   Scenarios: see the table at the end of the file. Output: "PASS ..." and exit 0; "FAIL: ..."
   lines and exit 1; "SETUP: ..." and exit 3 when the cut point could not be established (then
   the run proves nothing either way). Waits are bounded polling loops (each poll is one progress
   step of the fake); nothing sleeps. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/common/rc_connect.h"
#include "tests/fake_verbs/fake_verbs_control.h"

#define BUF_SIZE (1u << 20)
#define SRC_BASE 0u            /* locally written sources and READ destinations */
#define SRC_END (256u << 10)
#define RECV_BASE (256u << 10) /* receive slots */
#define RECV_SLOT 512u
#define RECV_SLOTS 512u /* the whole receive region: a slot is never reused within a run */
#define TGT_BASE (512u << 10) /* targets of the peer's RDMA WRITE / sources of its READ */
#define TGT_END BUF_SIZE
#define MAX_EXP 512
#define MAX_SEND_WR 64
#define MAX_RECV_WR 64
#define MAX_INLINE 128
#define CQ_SIZE 512
#define CQ_INITIAL 16 /* --resize-cq: cqe at creation, before ibv_resize_cq to CQ_SIZE */
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define POISON_SEED 0x9015u /* --rereg: the first buffer's pattern (+ device index) */
#define CQ_EX_BATCH 3 /* --cq-ex: completions per start_poll..end_poll cycle, at most */
#define ECE_VENDOR 0xfa4eu   /* --ece: the fake's vendor id */
#define ECE_DEFAULT 0x3u     /* --ece: the options a new fake QP has */
#define ECE_OPTIONS 0x1u     /* --ece: what the application sets on its QPs */
#define FAKE_DEVICES 4
#define LATE_RECV_CQE_STEPS 2000 /* late_recv_cqe: B's receive completions lag this many steps */
#define CQ_EX_WC_FLAGS                                                                      \
  (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |                   \
   IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |                         \
   IBV_WC_EX_WITH_DLID_PATH_BITS)
#define SRQ_MAX_WR 256  /* --srq: outstanding receives per SRQ (the scenarios keep < 64) */
#define STREAM_WARMUP 2 /* --srq: second-pair messages each way in warmup() */
#define BIG_DELAY 1000000u /* progress steps: "held on the wire until the port dies" */
#define REARM_RETRY_MS 600000 /* standby_blink: the shim's re-arm retry, far beyond any wait */
#define MARKER 0x5a
#define CLOBBER 0xee

/* ------------------------------------------------------------------ fake control API */

static struct {
  int (*port_down)(int);
  int (*port_up)(int);
  int (*set_delay)(int, unsigned);
  void (*progress)(void);
  int (*qp_stats)(uint32_t, struct fake_verbs_qp_stats*);
  int (*dev_stats)(int, struct fake_verbs_device_stats*);
  int (*list_qps)(int, uint32_t*, int);
  int (*set_recv_delay)(int, unsigned);
  int (*set_flush_on_modify_only)(int, int);
  int (*set_drop)(int, int);
  int (*set_retry_without_end_at_7)(int, int);
  int (*device_count)(void);
  void (*reset)(void);
} fv;

static void* fake_sym(const char* name) {
  void* p = dlvsym(RTLD_DEFAULT, name, FAKE_VERBS_CONTROL_VERSION);
  if (p == NULL) {
    printf("SETUP: %s@%s not found: not running on the fake libibverbs\n", name,
           FAKE_VERBS_CONTROL_VERSION);
    exit(3);
  }
  return p;
}

/* ------------------------------------------------------------------ reporting */

static int g_failures = 0;
static int g_quiet = 0; /* selftest: count failures without printing */
static int g_timeout_ms = 10000;
static const char* g_scenario = "?";

static void fail(const char* fmt, ...) {
  ++g_failures;
  if (g_quiet) return;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: [%s] ", g_scenario);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

static void setup_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("SETUP: [%s] ", g_scenario);
  vprintf(fmt, ap);
  printf(" (errno=%d %s)\n", errno, strerror(errno));
  va_end(ap);
  fflush(stdout);
  exit(3);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint8_t pattern_byte(uint32_t seed, uint32_t i) {
  uint32_t x = seed * 2654435761u ^ (i + 1) * 40503u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return (uint8_t)x;
}

static void fill_pattern(uint8_t* p, uint32_t len, uint32_t seed) {
  for (uint32_t i = 0; i < len; ++i) p[i] = pattern_byte(seed, i);
}

/* Index of the first wrong byte, or -1. */
static long check_pattern(const uint8_t* p, uint32_t len, uint32_t seed) {
  for (uint32_t i = 0; i < len; ++i)
    if (p[i] != pattern_byte(seed, i)) return (long)i;
  return -1;
}

static long check_fill(const uint8_t* p, uint32_t len, uint8_t value) {
  for (uint32_t i = 0; i < len; ++i)
    if (p[i] != value) return (long)i;
  return -1;
}

/* ------------------------------------------------------------------ model of the test */

struct side;

struct exp_send { /* a signaled send WR, in posting order */
  uint64_t wr_id;
  enum ibv_wc_opcode opcode;
  int is_read;
  uint32_t len;
  uint32_t mem; /* READ: index of its exp_mem entry */
};

struct exp_msg { /* a receive-consuming message the side will receive, in order */
  enum ibv_wc_opcode opcode;
  int with_imm;
  uint32_t imm; /* host order */
  uint32_t len;
  uint32_t seed;       /* SEND payload */
  int carries_payload; /* SEND/SEND_WITH_IMM: payload in the receive buffer */
  uint32_t mem_before; /* exp_mem entries recorded before it was posted */
};

struct posted_recv {
  uint64_t wr_id;
  uint32_t slot;
  /* --srq: who consumed it (NULL: not yet), and the hash of its buffer at that moment */
  struct side* by;
  int msg; /* index in by->msgs */
  uint64_t hash;
};

struct exp_mem { /* expected final content of a region */
  struct side* where;
  uint32_t off, len;
  uint32_t seed;
  int marker;    /* the owner overwrote it with MARKER after the notifying message */
  int is_read;   /* a READ destination (valid once the READ completed) */
  int read_done;
};

struct side {
  const char* name;
  int dev_index;
  uint64_t wr_base;
  /* The side that owns the receive queue model (recvs), the buffer allocators and the resources
     (context, PD, MR, CQs, SRQ): itself for A and B; A for A2 and B for B2 (--srq). */
  struct side* home;
  struct side* pair2;   /* --srq, on A and B: the second QP on the same SRQ (A2, B2); else NULL */
  struct ibv_srq* srq;  /* --srq */
  uint32_t stream_seq;  /* --srq, on A2 and B2: sequence number of the last stream message */
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_mr* mr;
  uint32_t peer_rkey; /* the rkey the peer gave this side (after --rereg: the new one) */
  uint8_t* buf_old;   /* --rereg: the buffer the MR was moved away from (poisoned); else NULL */
  struct ibv_cq* cq;
  struct ibv_cq* rcq; /* --split-cq: receives complete here; else == cq */
  struct ibv_cq_ex* cqx;  /* --cq-ex: the extended CQs behind cq and rcq (cq == */
  struct ibv_cq_ex* rcqx; /* ibv_cq_ex_to_cq(cqx)); NULL otherwise */
  struct ibv_qp* qp;
  struct ibv_qp_ex* qpx; /* --wr-api */
  uint8_t* buf;
  union ibv_gid gid;
  struct ibv_qp_cap cap;
  struct side* peer;
  struct exp_send sends[MAX_EXP];
  int n_sends, got_sends;
  struct exp_msg msgs[MAX_EXP];
  int n_msgs, got_msgs;
  struct posted_recv recvs[MAX_EXP];
  int n_recvs;
  uint32_t src_next, tgt_next;
  uint64_t next_wr;
  /* a batch of send WRs being built (posted by flush()) */
  struct ibv_send_wr batch[MAX_SEND_WR];
  struct ibv_sge batch_sge[MAX_SEND_WR];
  uint32_t batch_src[MAX_SEND_WR]; /* source offsets (inline buffers to clobber) */
  int batch_n;
  int batching;
};

static struct side g_a = {.name = "A", .dev_index = 0, .wr_base = 0xa000000000ull, .home = &g_a};
static struct side g_b = {.name = "B", .dev_index = 2, .wr_base = 0xb000000000ull, .home = &g_b};
/* --srq: the second pair, on A's and B's SRQs (and CQs) */
static struct side g_a2 = {.name = "A2", .dev_index = 0, .wr_base = 0xa200000000ull, .home = &g_a};
static struct side g_b2 = {.name = "B2", .dev_index = 2, .wr_base = 0xb200000000ull, .home = &g_b};
static struct exp_mem g_mem[MAX_EXP];
static uint32_t g_n_mem = 0;
static uint32_t g_seed = 1000;
static int g_wr_api = 0;
static int g_sig_all = 0;  /* --sig-all: QPs with sq_sig_all, every WR completes */
static int g_split_cq = 0; /* --split-cq: separate send and receive CQs */
static int g_srq = 0;      /* --srq: SRQs and a second QP pair on them */
static int g_cq_ex = 0;    /* --cq-ex: CQs from ibv_create_cq_ex, polled with the iterator */
static int g_rereg = 0;    /* --rereg: MRs moved to a second buffer (ibv_rereg_mr) before traffic */
static int g_resize_cq = 0; /* --resize-cq: CQs created small, ibv_resize_cq'd before traffic */
static int g_ece = 0;       /* --ece: every QP set to ECE_OPTIONS before RTR */
static int g_rxe_flush = 0; /* --rxe-flush: every device flushes an ERR QP's new receives late */
static int g_silent_cut = 0; /* --silent-cut: the cut drops fake0's packets, no port event */
static int g_rxe_retry = 0;  /* --rxe-retry: retry_cnt 7 retries without end on every device */
static long g_cq_ex_cycles = 0, g_cq_ex_left_early = 0; /* --cq-ex: reported at the end */

static uint32_t bump(uint32_t* next, uint32_t len, uint32_t end, const char* what) {
  uint32_t off = *next;
  *next += (len + 63u) & ~63u;
  if (*next > end) setup_fail("out of %s space", what);
  return off;
}

static enum ibv_wc_opcode wc_opcode_of(enum ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    default: return IBV_WC_SEND;
  }
}

static int consumes_receive(enum ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

enum { SIG = 1, INL = 2 };

/* Records the expectations of one send WR of `s` and fills its source; returns its index in the
   batch. The WR is posted by flush() (immediately unless s->batching). */
static void flush(struct side* s);

static uint64_t post_op_seed(struct side* s, enum ibv_wr_opcode op, uint32_t len, int flags,
                             uint32_t imm, uint32_t seed) {
  struct side* peer = s->peer;
  if (s->batch_n >= MAX_SEND_WR) setup_fail("batch too long");
  const uint64_t wr_id = s->wr_base + ++s->next_wr;
  const uint32_t src = bump(&s->home->src_next, len ? len : 1, SRC_END, "source");
  uint32_t tgt = 0;
  const uint32_t mem_before = g_n_mem;
  if (g_n_mem >= MAX_EXP || s->n_sends >= MAX_EXP || peer->n_msgs >= MAX_EXP)
    setup_fail("too many expectations");
  if (op == IBV_WR_RDMA_READ) {
    tgt = bump(&peer->home->tgt_next, len, TGT_END, "target");
    fill_pattern(peer->buf + tgt, len, seed); /* the peer's application data */
    memset(s->buf + src, 0, len);
    g_mem[g_n_mem] = (struct exp_mem){.where = s, .off = src, .len = len, .seed = seed,
                                      .is_read = 1};
    ++g_n_mem;
  } else {
    fill_pattern(s->buf + src, len, seed);
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      tgt = bump(&peer->home->tgt_next, len ? len : 1, TGT_END, "target");
      memset(peer->buf + tgt, 0, len);
      g_mem[g_n_mem++] = (struct exp_mem){.where = peer, .off = tgt, .len = len, .seed = seed};
    }
  }
  if (consumes_receive(op)) {
    struct exp_msg* m = &peer->msgs[peer->n_msgs++];
    m->opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    m->with_imm = op != IBV_WR_SEND;
    m->imm = imm;
    m->len = len;
    m->seed = seed;
    m->carries_payload = op != IBV_WR_RDMA_WRITE_WITH_IMM;
    m->mem_before = mem_before;
  }
  if ((flags & SIG) || g_sig_all) {
    struct exp_send* e = &s->sends[s->n_sends++];
    e->wr_id = wr_id;
    e->opcode = wc_opcode_of(op);
    e->is_read = op == IBV_WR_RDMA_READ;
    e->len = len;
    e->mem = op == IBV_WR_RDMA_READ ? g_n_mem - 1 : 0;
  }
  /* The WR itself. */
  const int i = s->batch_n++;
  struct ibv_send_wr* wr = &s->batch[i];
  memset(wr, 0, sizeof *wr);
  wr->wr_id = wr_id;
  wr->opcode = op;
  wr->send_flags = ((flags & SIG) ? IBV_SEND_SIGNALED : 0) | ((flags & INL) ? IBV_SEND_INLINE : 0);
  wr->imm_data = htonl(imm);
  s->batch_sge[i].addr = (uintptr_t)(s->buf + src);
  s->batch_sge[i].length = len;
  s->batch_sge[i].lkey = s->mr->lkey;
  s->batch_src[i] = src;
  wr->sg_list = &s->batch_sge[i];
  wr->num_sge = len ? 1 : 0;
  if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) {
    wr->wr.rdma.remote_addr = (uintptr_t)(peer->buf + tgt);
    wr->wr.rdma.rkey = s->peer_rkey;
  }
  if (!s->batching) flush(s);
  return wr_id;
}

static uint64_t post_op(struct side* s, enum ibv_wr_opcode op, uint32_t len, int flags,
                        uint32_t imm) {
  return post_op_seed(s, op, len, flags, imm, ++g_seed);
}

static void flush(struct side* s) {
  const int n = s->batch_n;
  if (n == 0) return;
  int rc;
  if (!g_wr_api) {
    for (int i = 0; i + 1 < n; ++i) s->batch[i].next = &s->batch[i + 1];
    s->batch[n - 1].next = NULL;
    struct ibv_send_wr* bad = NULL;
    rc = ibv_post_send(s->qp, &s->batch[0], &bad);
  } else {
    struct ibv_qp_ex* q = s->qpx;
    ibv_wr_start(q);
    for (int i = 0; i < n; ++i) {
      const struct ibv_send_wr* wr = &s->batch[i];
      q->wr_id = wr->wr_id;
      q->wr_flags = wr->send_flags & (IBV_SEND_SIGNALED | IBV_SEND_INLINE);
      switch (wr->opcode) {
        case IBV_WR_SEND: ibv_wr_send(q); break;
        case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(q, wr->imm_data); break;
        case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr); break;
        case IBV_WR_RDMA_WRITE_WITH_IMM:
          ibv_wr_rdma_write_imm(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, wr->imm_data);
          break;
        case IBV_WR_RDMA_READ: ibv_wr_rdma_read(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr); break;
        default: setup_fail("opcode");
      }
      if (wr->send_flags & IBV_SEND_INLINE) {
        ibv_wr_set_inline_data(q, (void*)(uintptr_t)s->batch_sge[i].addr, s->batch_sge[i].length);
      } else if (wr->num_sge) {
        ibv_wr_set_sge(q, s->batch_sge[i].lkey, s->batch_sge[i].addr, s->batch_sge[i].length);
      } else {
        ibv_wr_set_sge_list(q, 0, NULL);
      }
    }
    rc = ibv_wr_complete(q);
  }
  if (rc != 0) {
    errno = rc;
    fail("%s: posting %d send WR(s) failed: %s", s->name, n, strerror(rc));
  }
  /* The application reuses inline buffers as soon as the post returned. */
  for (int i = 0; i < n; ++i) {
    if (s->batch[i].send_flags & IBV_SEND_INLINE)
      memset(s->buf + s->batch_src[i], CLOBBER, s->batch_sge[i].length);
  }
  s->batch_n = 0;
}

static void begin_batch(struct side* s) { s->batching = 1; }
static void end_batch(struct side* s) {
  s->batching = 0;
  flush(s);
}

/* Posts `count` receives to the side's QP, or (--srq) to its SRQ; `s` is A or B (a home). */
static void post_recvs(struct side* s, int count) {
  for (int k = 0; k < count; ++k) {
    if (s->n_recvs >= (int)RECV_SLOTS || s->n_recvs >= MAX_EXP)
      setup_fail("%s: out of receive slots", s->name);
    struct posted_recv* r = &s->recvs[s->n_recvs];
    r->wr_id = s->wr_base + 0x800000ull + (uint64_t)s->n_recvs;
    r->slot = (uint32_t)s->n_recvs % RECV_SLOTS;
    r->by = NULL;
    r->msg = -1;
    r->hash = 0;
    memset(s->buf + RECV_BASE + r->slot * RECV_SLOT, 0, RECV_SLOT);
    struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + RECV_BASE + r->slot * RECV_SLOT),
                          .length = RECV_SLOT,
                          .lkey = s->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = r->wr_id, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr* bad = NULL;
    const int rc = g_srq ? ibv_post_srq_recv(s->srq, &wr, &bad) : ibv_post_recv(s->qp, &wr, &bad);
    if (rc != 0) {
      fail("%s: %s failed: %s", s->name, g_srq ? "ibv_post_srq_recv" : "ibv_post_recv",
           strerror(rc));
      return;
    }
    ++s->n_recvs;
  }
}

/* --srq: the second pair's stream. One message each way per call (A2 -> B2, then B2 -> A2):
   small SENDs, odd sequence numbers SEND_WITH_IMM (signaled), even ones plain SEND (every 4th
   unsignaled). The tag 0x2<dir><seq> (0x2a000003 = pair 2, from A2, message 3) is both the
   imm_data and the seed of the payload pattern, so a stray payload can be recognised. */
static void stream_msg(struct side* s) {
  const uint32_t seq = ++s->stream_seq;
  const uint32_t tag = 0x20000000u | (s == &g_a2 ? 0x0a000000u : 0x0b000000u) | (seq & 0xffffffu);
  const uint32_t len = 8 + seq * 13 % 57;
  if (seq % 2 == 1)
    post_op_seed(s, IBV_WR_SEND_WITH_IMM, len, SIG, tag, tag);
  else
    post_op_seed(s, IBV_WR_SEND, len, seq % 4 == 0 ? 0 : SIG, 0, tag);
}

static void stream(int rounds) {
  if (!g_srq) return;
  for (int i = 0; i < rounds; ++i) {
    stream_msg(&g_a2);
    stream_msg(&g_b2);
  }
}

/* Receives still free for messages (posted minus expected consumers of the queue). */
static int recvs_left(const struct side* s) {
  return s->n_recvs - s->n_msgs - (s->pair2 ? s->pair2->n_msgs : 0);
}

/* ------------------------------------------------------------------ completion checks */

static const char* wc_desc(const struct ibv_wc* wc) {
  static char text[256];
  snprintf(text, sizeof text,
           "wr_id=%#llx status=%s(%d) opcode=%d byte_len=%u imm=%#x flags=%#x qp_num=%u",
           (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status), wc->status, wc->opcode,
           wc->byte_len, ntohl(wc->imm_data), wc->wc_flags, wc->qp_num);
  return text;
}

static long check_mem_entry(const struct exp_mem* m) {
  const uint8_t* p = m->where->buf + m->off;
  return m->marker ? check_fill(p, m->len, MARKER) : check_pattern(p, m->len, m->seed);
}

static void on_send_wc(struct side* s, const struct ibv_wc* wc) {
  const int k = s->got_sends;
  if (k >= s->n_sends) {
    fail("%s: unexpected send completion after all %d expected ones (a duplicate?): %s", s->name,
         s->n_sends, wc_desc(wc));
    return;
  }
  const struct exp_send* e = &s->sends[k];
  if (wc->wr_id != e->wr_id) {
    int later = -1, earlier = -1;
    for (int j = k + 1; j < s->n_sends; ++j)
      if (s->sends[j].wr_id == wc->wr_id) later = j;
    for (int j = 0; j < k; ++j)
      if (s->sends[j].wr_id == wc->wr_id) earlier = j;
    fail("%s: send completion #%d should be wr_id=%#llx, got %s (%s)", s->name, k,
         (unsigned long long)e->wr_id, wc_desc(wc),
         earlier >= 0 ? "a DUPLICATE of an earlier completion"
                      : later >= 0 ? "a later WR: completions LOST or out of order"
                                   : "not a WR of this QP");
    if (earlier >= 0) return;
    if (later >= 0) s->got_sends = later + 1; /* resynchronise so one loss is one failure */
    return;
  }
  if (wc->opcode != e->opcode)
    fail("%s: send completion wr_id=%#llx has opcode %d, expected %d", s->name,
         (unsigned long long)e->wr_id, wc->opcode, e->opcode);
  if (e->is_read) {
    if (wc->byte_len != e->len)
      fail("%s: RDMA_READ wr_id=%#llx byte_len %u, expected %u", s->name,
           (unsigned long long)e->wr_id, wc->byte_len, e->len);
    struct exp_mem* m = &g_mem[e->mem];
    const long bad = check_mem_entry(m);
    if (bad >= 0)
      fail("%s: RDMA_READ wr_id=%#llx completed but its destination differs from the source at "
           "byte %ld", s->name, (unsigned long long)e->wr_id, bad);
    m->read_done = 1;
  }
  s->got_sends = k + 1;
}

static void check_msg(struct side* s, int j, const struct ibv_wc* wc, uint32_t slot);
static void on_srq_recv_wc(struct side* s, const struct ibv_wc* wc);

/* FNV-1a of a receive slot (--srq: a consumed buffer must never change again). */
static uint64_t slot_hash(const struct side* h, uint32_t slot) {
  const uint8_t* p = h->buf + RECV_BASE + slot * RECV_SLOT;
  uint64_t x = 1469598103934665603ull;
  for (uint32_t i = 0; i < RECV_SLOT; ++i) x = (x ^ p[i]) * 1099511628211ull;
  return x;
}

static void on_recv_wc(struct side* s, const struct ibv_wc* wc) {
  if (g_srq) {
    on_srq_recv_wc(s, wc);
    return;
  }
  const int j = s->got_msgs;
  if (j >= s->n_msgs) {
    fail("%s: unexpected receive completion after all %d expected messages (a DUPLICATE "
         "delivery?): %s", s->name, s->n_msgs, wc_desc(wc));
    return;
  }
  if (j >= s->n_recvs) {
    fail("%s: receive completion #%d but only %d receives were posted: %s", s->name, j,
         s->n_recvs, wc_desc(wc));
    return;
  }
  const struct posted_recv* r = &s->recvs[j];
  if (wc->wr_id != r->wr_id) {
    fail("%s: receive completion #%d should consume receive wr_id=%#llx, got %s (receives "
         "consumed out of order, lost or duplicated)", s->name, j, (unsigned long long)r->wr_id,
         wc_desc(wc));
    for (int k = j + 1; k < s->n_recvs && k < s->n_msgs; ++k)
      if (s->recvs[k].wr_id == wc->wr_id) s->got_msgs = k + 1;
    return;
  }
  s->got_msgs = j + 1;
  check_msg(s, j, wc, r->slot);
}

/* --srq: a receive completion of QP `s` (A, A2, B or B2) consumes one receive of its home's SRQ:
   any one not consumed yet (post order across the QPs is not checked), and it must be message
   #got_msgs of this QP. */
static int find_recv(const struct side* h, uint64_t wr_id) {
  for (int k = 0; k < h->n_recvs; ++k)
    if (h->recvs[k].wr_id == wr_id) return k;
  return -1;
}

static void on_srq_recv_wc(struct side* s, const struct ibv_wc* wc) {
  struct side* h = s->home;
  const int j = s->got_msgs;
  if (j >= s->n_msgs) {
    fail("%s: unexpected receive completion after all %d expected messages of this QP (a "
         "DUPLICATE delivery?): %s", s->name, s->n_msgs, wc_desc(wc));
    return;
  }
  const int k = find_recv(h, wc->wr_id);
  if (k < 0) {
    fail("%s: receive completion #%d names wr_id=%#llx, never posted to %s's SRQ%s: %s", s->name,
         j, (unsigned long long)wc->wr_id, h->name,
         find_recv(h->peer->home, wc->wr_id) >= 0 ? " (a receive of the OTHER side's SRQ)" : "",
         wc_desc(wc));
    s->got_msgs = j + 1; /* one defect, one failure */
    return;
  }
  struct posted_recv* r = &h->recvs[k];
  if (r->by != NULL) {
    fail("%s: receive completion #%d consumes SRQ receive wr_id=%#llx (slot %u) AGAIN: %s "
         "message #%d consumed it already (one receive buffer handed to two messages): %s",
         s->name, j, (unsigned long long)r->wr_id, r->slot, r->by->name, r->msg, wc_desc(wc));
    s->got_msgs = j + 1;
    return;
  }
  r->by = s;
  r->msg = j;
  s->got_msgs = j + 1;
  check_msg(s, j, wc, r->slot);
  r->hash = slot_hash(h, r->slot);
}

static const char* srq_buffer_holds(const struct side* h, uint32_t slot) {
  /* Diagnostic: whose payload is in this receive buffer? */
  static char text[96];
  const uint8_t* p = h->buf + RECV_BASE + slot * RECV_SLOT;
  const struct side* qps[2] = {h, h->pair2};
  for (int q = 0; q < 2; ++q) {
    if (!qps[q]) continue;
    for (int i = 0; i < qps[q]->n_msgs; ++i) {
      const struct exp_msg* m = &qps[q]->msgs[i];
      if (m->carries_payload && m->len > 0 && check_pattern(p, m->len, m->seed) < 0) {
        snprintf(text, sizeof text, "it holds %s message #%d's payload", qps[q]->name, i);
        return text;
      }
    }
  }
  return "wrong bytes";
}

/* Opcode, imm, byte_len, payload (in receive slot `slot` of s->home) and RC ordering of message
   #j of QP `s`, given its receive completion. */
static void check_msg(struct side* s, int j, const struct ibv_wc* wc, uint32_t slot) {
  const struct exp_msg* m = &s->msgs[j];
  const uint8_t* buf = s->home->buf + RECV_BASE + slot * RECV_SLOT;
  if (wc->opcode != m->opcode)
    fail("%s: message #%d opcode %d, expected %d: %s", s->name, j, wc->opcode, m->opcode,
         wc_desc(wc));
  const int has_imm = (wc->wc_flags & IBV_WC_WITH_IMM) != 0;
  if (has_imm != m->with_imm || (has_imm && ntohl(wc->imm_data) != m->imm))
    fail("%s: message #%d imm %s%#x, expected %s%#x (a different message: lost, duplicated or "
         "reordered)", s->name, j, has_imm ? "" : "none/", ntohl(wc->imm_data),
         m->with_imm ? "" : "none/", m->imm);
  if (wc->byte_len != m->len)
    fail("%s: message #%d byte_len %u, expected %u", s->name, j, wc->byte_len, m->len);
  if (m->carries_payload) {
    const long bad = check_pattern(buf, m->len, m->seed);
    if (bad >= 0)
      fail("%s: message #%d payload differs at byte %ld (0x%02x): %s", s->name, j, bad, buf[bad],
           buf[bad] == CLOBBER ? "the sender's reused inline buffer was sent, not the bytes posted"
           : g_srq             ? srq_buffer_holds(s->home, slot)
                               : "wrong bytes");
  }
  /* RC ordering: every RDMA WRITE posted to us before this message is visible now. */
  for (uint32_t k = 0; k < m->mem_before; ++k) {
    const struct exp_mem* e = &g_mem[k];
    if (e->where != s || e->is_read) continue;
    const long bad = check_mem_entry(e);
    if (bad >= 0)
      fail("%s: message #%d arrived but an earlier RDMA WRITE at offset %#x is not in place "
           "(byte %ld is 0x%02x)%s", s->name, j, e->off, bad, e->where->buf[e->off + bad],
           e->marker ? ": a region this side took over was overwritten (a REPLAYED write)" : "");
  }
}

static void on_wc(struct side* s, const struct ibv_wc* wc) {
  if (wc->qp_num != s->qp->qp_num) {
    if (s->pair2)
      fail("%s: completion reports qp_num %u, the application's QPs on this CQ are %u and %u "
           "(%s): %s", s->name, wc->qp_num, s->qp->qp_num, s->pair2->qp->qp_num, s->pair2->name,
           wc_desc(wc));
    else
      fail("%s: completion reports qp_num %u, the application's QP is %u: %s", s->name,
           wc->qp_num, s->qp->qp_num, wc_desc(wc));
  }
  if (wc->status != IBV_WC_SUCCESS) {
    fail("%s: error completion surfaced: %s", s->name, wc_desc(wc));
    return;
  }
  if (wc->opcode & IBV_WC_RECV)
    on_recv_wc(s, wc);
  else
    on_send_wc(s, wc);
}

/* ------------------------------------------------------------------ polling */

enum { POLL_A = 1, POLL_B = 2, POLL_BOTH = 3 };

/* --srq: A2 (B2) completes on A's (B's) CQs; the completion's qp_num tells whose it is. Anything
   not A2's (B2's) is checked as A's (B's), which rejects a foreign qp_num. */
static struct side* qp_owner(struct side* s, const struct ibv_wc* wc) {
  return s->pair2 && wc->qp_num == s->pair2->qp->qp_num ? s->pair2 : s;
}

/* One completion polled from `cq` (one of side s's CQs). */
static void on_polled_wc(struct side* s, struct ibv_cq* cq, const struct ibv_wc* wc) {
  if (cq != s->rcq && (wc->opcode & IBV_WC_RECV) && wc->status == IBV_WC_SUCCESS)
    fail("%s: a receive completion on the send CQ: %s", s->name, wc_desc(wc));
  if (cq != s->cq && !(wc->opcode & IBV_WC_RECV) && wc->status == IBV_WC_SUCCESS)
    fail("%s: a send completion on the receive CQ: %s", s->name, wc_desc(wc));
  on_wc(qp_owner(s, wc), wc);
}

/* --cq-ex: the iterator's current completion as a struct ibv_wc (the fields the CQ was created
   with, CQ_EX_WC_FLAGS; pkey_index has no reader and stays 0). */
static void read_wc_ex(struct ibv_cq_ex* cqx, struct ibv_wc* wc) {
  memset(wc, 0, sizeof *wc);
  wc->wr_id = cqx->wr_id;
  wc->status = cqx->status;
  wc->opcode = ibv_wc_read_opcode(cqx);
  wc->vendor_err = ibv_wc_read_vendor_err(cqx);
  wc->byte_len = ibv_wc_read_byte_len(cqx);
  wc->imm_data = ibv_wc_read_imm_data(cqx);
  wc->qp_num = ibv_wc_read_qp_num(cqx);
  wc->src_qp = ibv_wc_read_src_qp(cqx);
  wc->wc_flags = ibv_wc_read_wc_flags(cqx);
  wc->slid = (uint16_t)ibv_wc_read_slid(cqx);
  wc->sl = ibv_wc_read_sl(cqx);
  wc->dlid_path_bits = ibv_wc_read_dlid_path_bits(cqx);
}

/* --cq-ex: one start_poll..end_poll cycle on `cqx` (behind s's CQ `cq`). It takes at most
   CQ_EX_BATCH completions and then leaves the iterator early (end_poll while more may be
   queued): those must come in a later cycle, none lost, none twice. ENOENT from start_poll: empty
   (no end_poll then, as the verbs API requires). */
static int poll_cq_ex(struct side* s, struct ibv_cq* cq, struct ibv_cq_ex* cqx) {
  struct ibv_poll_cq_attr attr = {.comp_mask = 0};
  int rc = ibv_start_poll(cqx, &attr);
  if (rc == ENOENT) return 0;
  if (rc != 0) {
    fail("%s: ibv_start_poll returned %d (%s)", s->name, rc, strerror(rc));
    return 0;
  }
  ++g_cq_ex_cycles;
  int n = 0;
  for (;;) {
    struct ibv_wc wc;
    read_wc_ex(cqx, &wc); /* before next_poll: it moves the iterator */
    ++n;
    on_polled_wc(s, cq, &wc);
    if (n == CQ_EX_BATCH) { /* leave early: the rest is for the next cycle */
      ++g_cq_ex_left_early;
      break;
    }
    rc = ibv_next_poll(cqx);
    if (rc == ENOENT) break;
    if (rc != 0) {
      fail("%s: ibv_next_poll returned %d (%s)", s->name, rc, strerror(rc));
      break;
    }
  }
  ibv_end_poll(cqx);
  return n;
}

static int poll_cq(struct side* s, struct ibv_cq* cq) {
  if (g_cq_ex) return poll_cq_ex(s, cq, cq == s->cq ? s->cqx : s->rcqx);
  struct ibv_wc wc[16];
  const int n = ibv_poll_cq(cq, 16, wc);
  if (n < 0) {
    fail("%s: ibv_poll_cq returned %d", s->name, n);
    return 0;
  }
  for (int i = 0; i < n; ++i) on_polled_wc(s, cq, &wc[i]);
  return n;
}

static int poll_side(struct side* s) {
  int n = poll_cq(s, s->cq);
  if (s->rcq != s->cq) n += poll_cq(s, s->rcq);
  return n;
}

static int side_done(const struct side* s) {
  return s->got_sends == s->n_sends && s->got_msgs == s->n_msgs;
}

static int all_done(void) {
  return side_done(&g_a) && side_done(&g_b) && (!g_srq || (side_done(&g_a2) && side_done(&g_b2)));
}

static void report_progress(const char* what) {
  char pair2[128] = "";
  if (g_srq)
    snprintf(pair2, sizeof pair2, ", A2 sends %d/%d msgs %d/%d, B2 sends %d/%d msgs %d/%d",
             g_a2.got_sends, g_a2.n_sends, g_a2.got_msgs, g_a2.n_msgs, g_b2.got_sends,
             g_b2.n_sends, g_b2.got_msgs, g_b2.n_msgs);
  fail("timeout (%d ms) waiting for %s: A sends %d/%d msgs %d/%d, B sends %d/%d msgs %d/%d%s",
       g_timeout_ms, what, g_a.got_sends, g_a.n_sends, g_a.got_msgs, g_a.n_msgs, g_b.got_sends,
       g_b.n_sends, g_b.got_msgs, g_b.n_msgs, pair2);
}

/* Polls (each poll is a progress step of the fake) until cond() holds; stops early on a failure
   so that a broken run ends at once. 0 = reached. */
static int wait_for(int (*cond)(void), int which, const char* what) {
  const long long deadline = now_ms() + g_timeout_ms;
  const int failures = g_failures;
  for (;;) {
    int got = 0;
    if (which & POLL_A) got += poll_side(&g_a);
    if (which & POLL_B) got += poll_side(&g_b);
    if (g_failures != failures) return -1;
    if (cond()) return 0;
    if (now_ms() > deadline) {
      report_progress(what);
      return -1;
    }
    if (got == 0) sched_yield(); /* let the shim's engine thread run */
  }
}

static int b_got_all_msgs(void) { return g_b.got_msgs == g_b.n_msgs; }
static int a_got_all_sends(void) { return g_a.got_sends == g_a.n_sends; }

static struct fake_verbs_qp_stats qp_stats(struct side* s) {
  struct fake_verbs_qp_stats st;
  memset(&st, 0, sizeof st);
  if (fv.qp_stats(s->qp->qp_num, &st) != 0) setup_fail("fake_verbs_query_qp_stats");
  return st;
}

/* ------------------------------------------------------------------ setup */

static struct ibv_device** g_devices;
static void create_qp(struct side* s, const char* want);

/* A CQ of side s: ibv_create_cq, or (--cq-ex) ibv_create_cq_ex with the same cqe count and no
   completion channel, returned as its ibv_cq (*cqx: the extended CQ, NULL without --cq-ex).
   CQ_SIZE entries, or (--resize-cq) CQ_INITIAL until resize_cqs() grows it. */
static struct ibv_cq* create_cq(struct side* s, struct ibv_cq_ex** cqx, const char* want) {
  const int cqe = g_resize_cq ? CQ_INITIAL : CQ_SIZE;
  *cqx = NULL;
  if (!g_cq_ex) {
    struct ibv_cq* cq = ibv_create_cq(s->ctx, cqe, NULL, NULL, 0);
    if (!cq) setup_fail("ibv_create_cq on %s", want);
    return cq;
  }
  struct ibv_cq_init_attr_ex attr = {.cqe = (uint32_t)cqe,
                                     .cq_context = NULL,
                                     .channel = NULL,
                                     .comp_vector = 0,
                                     .wc_flags = CQ_EX_WC_FLAGS};
  *cqx = ibv_create_cq_ex(s->ctx, &attr);
  if (!*cqx) setup_fail("ibv_create_cq_ex on %s", want);
  return ibv_cq_ex_to_cq(*cqx);
}

static void open_side(struct side* s) {
  int n = 0;
  if (!g_devices) g_devices = ibv_get_device_list(&n);
  struct ibv_device* dev = NULL;
  char want[16];
  snprintf(want, sizeof want, "fake%d", s->dev_index);
  for (int i = 0; g_devices && g_devices[i]; ++i)
    if (strcmp(ibv_get_device_name(g_devices[i]), want) == 0) dev = g_devices[i];
  if (!dev) setup_fail("device %s not found", want);
  s->ctx = ibv_open_device(dev);
  if (!s->ctx) setup_fail("ibv_open_device(%s)", want);
  s->pd = ibv_alloc_pd(s->ctx);
  if (!s->pd) setup_fail("ibv_alloc_pd");
  if (posix_memalign((void**)&s->buf, 4096, BUF_SIZE) != 0) setup_fail("memory");
  if (g_rereg) /* this buffer is left behind by rereg_side() before any traffic */
    fill_pattern(s->buf, BUF_SIZE, POISON_SEED + (uint32_t)s->dev_index);
  else
    memset(s->buf, 0, BUF_SIZE);
  s->mr = ibv_reg_mr(s->pd, s->buf, BUF_SIZE, MR_ACCESS);
  if (!s->mr) setup_fail("ibv_reg_mr");
  s->cq = create_cq(s, &s->cqx, want);
  if (g_split_cq) {
    s->rcq = create_cq(s, &s->rcqx, want);
  } else {
    s->rcq = s->cq;
    s->rcqx = s->cqx;
  }
  if (g_srq) {
    struct ibv_srq_init_attr sattr = {.attr = {.max_wr = SRQ_MAX_WR, .max_sge = 1}};
    s->srq = ibv_create_srq(s->pd, &sattr);
    if (!s->srq) setup_fail("ibv_create_srq on %s", want);
  }
  create_qp(s, want);
  if (ibv_query_gid(s->ctx, 1, 1, &s->gid) != 0) setup_fail("ibv_query_gid index 1");
  s->src_next = SRC_BASE;
  s->tgt_next = TGT_BASE;
}

/* --srq: the second QP on the side `home` (A2 on A's context/PD/MR/CQs/SRQ, B2 on B's). */
static void open_second(struct side* s, struct side* home) {
  s->home = home;
  s->ctx = home->ctx;
  s->pd = home->pd;
  s->mr = home->mr;
  s->cq = home->cq;
  s->rcq = home->rcq;
  s->cqx = home->cqx;
  s->rcqx = home->rcqx;
  s->srq = home->srq;
  s->buf = home->buf;
  s->gid = home->gid;
  home->pair2 = s;
  char want[16];
  snprintf(want, sizeof want, "fake%d", s->dev_index);
  create_qp(s, want);
}

static void create_qp(struct side* s, const char* want) {
  /* With an SRQ the QP has no receive queue of its own: max_recv_wr/sge are ignored. */
  struct ibv_qp_cap cap = {.max_send_wr = MAX_SEND_WR,
                           .max_recv_wr = s->srq ? 0 : MAX_RECV_WR,
                           .max_send_sge = 1,
                           .max_recv_sge = s->srq ? 0 : 1,
                           .max_inline_data = MAX_INLINE};
  if (!g_wr_api) {
    struct ibv_qp_init_attr attr = {
        .send_cq = s->cq, .recv_cq = s->rcq, .srq = s->srq, .cap = cap, .qp_type = IBV_QPT_RC,
        .sq_sig_all = g_sig_all};
    s->qp = ibv_create_qp(s->pd, &attr);
  } else {
    struct ibv_qp_init_attr_ex attr = {
        .send_cq = s->cq,
        .recv_cq = s->rcq,
        .srq = s->srq,
        .cap = cap,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = g_sig_all,
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = s->pd,
        .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_READ};
    s->qp = ibv_create_qp_ex(s->ctx, &attr);
    if (s->qp) s->qpx = ibv_qp_to_qp_ex(s->qp);
    if (s->qp && !s->qpx) setup_fail("ibv_qp_to_qp_ex");
  }
  if (!s->qp) setup_fail("creating the QP on %s", want);
  struct ibv_qp_attr qattr;
  struct ibv_qp_init_attr init;
  if (ibv_query_qp(s->qp, &qattr, IBV_QP_CAP, &init) != 0) setup_fail("ibv_query_qp");
  s->cap = init.cap;
  if (g_ece) {
    struct ibv_ece ece;
    memset(&ece, 0, sizeof ece);
    if (ibv_query_ece(s->qp, &ece) != 0 || ece.vendor_id != ECE_VENDOR || ece.options != ECE_DEFAULT)
      setup_fail("ibv_query_ece on %s: vendor %#x options %#x", want, ece.vendor_id, ece.options);
    ece.options = ECE_OPTIONS;
    if (ibv_set_ece(s->qp, &ece) != 0) setup_fail("ibv_set_ece on %s", want);
  }
}

/* --ece, at the end: every QP on the fabric runs with the option the application chose. */
static void check_ece(void) {
  int checked = 0, not_connected = 0;
  for (int dev = 0; dev < FAKE_DEVICES; ++dev) {
    uint32_t qps[64];
    const int n = fv.list_qps(dev, qps, 64);
    if (n < 0 || n > 64) {
      fail("ece: fake%d lists %d QP(s)", dev, n);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      struct fake_verbs_qp_stats st;
      if (fv.qp_stats(qps[i], &st) != 0) continue;
      /* A QP in RESET or INIT (a path being re-armed) has not used its options yet: they apply
         at RTR, and the shim sets them right before. */
      if (st.qp_state == IBV_QPS_RESET || st.qp_state == IBV_QPS_INIT) {
        ++not_connected;
        continue;
      }
      ++checked;
      if (st.ece_options != ECE_OPTIONS)
        fail("ece: qp %u on fake%d (state %llu) runs with ECE options %#llx, not the "
             "application's %#x", qps[i], dev, (unsigned long long)st.qp_state,
             (unsigned long long)st.ece_options, ECE_OPTIONS);
    }
    printf("ece: fake%d has %d QP(s)\n", dev, n);
  }
  printf("ece: %d connected QP(s) checked, %d not connected (RESET/INIT)\n", checked,
         not_connected);
  if (checked < 2) fail("ece: only %d connected QP(s) on the fabric", checked);
}

/* --resize-cq: the side's CQs (created with CQ_INITIAL entries, the QPs already on them) grow
   to CQ_SIZE. */
static void resize_cqs(struct side* s) {
  struct ibv_cq* cqs[2] = {s->cq, s->rcq != s->cq ? s->rcq : NULL};
  for (int i = 0; i < 2; ++i) {
    struct ibv_cq* cq = cqs[i];
    if (!cq) continue;
    const int before = cq->cqe;
    const int rc = ibv_resize_cq(cq, CQ_SIZE);
    if (rc != 0) {
      errno = rc;
      setup_fail("%s: ibv_resize_cq(%d -> %d) returned %d", s->name, before, CQ_SIZE, rc);
    }
    if (cq->cqe < (int)CQ_SIZE)
      fail("%s: after ibv_resize_cq(%d) the CQ reports cqe=%d", s->name, CQ_SIZE, cq->cqe);
    printf("resize-cq: %s's %s CQ %d -> %d entries\n", s->name,
           cqs[1] ? (i == 0 ? "send" : "receive") : "shared", before, cq->cqe);
  }
}

/* --rereg: the side's MR moves to a second buffer of the same size (same access flags), before
   any traffic; its first buffer keeps the poison open_side() put there (check_poison). */
static void rereg_side(struct side* s) {
  uint8_t* buf2 = NULL;
  if (posix_memalign((void**)&buf2, 4096, BUF_SIZE) != 0) setup_fail("memory");
  memset(buf2, 0, BUF_SIZE);
  const uint32_t lkey = s->mr->lkey, rkey = s->mr->rkey;
  const int rc = ibv_rereg_mr(s->mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS,
                              NULL, buf2, BUF_SIZE, MR_ACCESS);
  if (rc != 0) setup_fail("%s: ibv_rereg_mr onto the second buffer returned %d", s->name, rc);
  if (s->mr->addr != buf2 || s->mr->length != BUF_SIZE)
    fail("%s: after ibv_rereg_mr the MR says addr=%p length=%zu, expected %p and %u", s->name,
         s->mr->addr, s->mr->length, (void*)buf2, BUF_SIZE);
  if (s->mr->lkey == lkey || s->mr->rkey == rkey)
    setup_fail("%s: ibv_rereg_mr kept the keys (lkey %#x, rkey %#x): the fake hands out new ones, "
               "without them a stale key would go unnoticed", s->name, lkey, rkey);
  printf("rereg: %s's MR moved to its second buffer, lkey %#x -> %#x, rkey %#x -> %#x\n",
         s->name, lkey, s->mr->lkey, rkey, s->mr->rkey);
  s->buf_old = s->buf;
  s->buf = buf2;
  if (s->pair2) s->pair2->buf = buf2; /* --srq: A2/B2 share the side's MR and buffer */
}

/* --rereg, at the end: the first buffer holds nothing but its poison. */
static void check_poison(const struct side* s) {
  if (!s->buf_old) return;
  const long bad = check_pattern(s->buf_old, BUF_SIZE, POISON_SEED + (uint32_t)s->dev_index);
  if (bad >= 0)
    fail("%s: the buffer its MR was moved away from (ibv_rereg_mr) was written at offset %#lx "
         "(0x%02x): a request went through a stale, pre-rereg registration", s->name,
         (unsigned long)bad, s->buf_old[bad]);
}

static void setup(int recvs_a, int recvs_b) {
  fv.reset();
  for (int dev = 0; g_rxe_flush && dev < fv.device_count(); ++dev)
    if (fv.set_flush_on_modify_only(dev, 1) != 0) setup_fail("fake_verbs_set_flush_on_modify_only");
  for (int dev = 0; g_rxe_retry && dev < fv.device_count(); ++dev)
    if (fv.set_retry_without_end_at_7(dev, 1) != 0)
      setup_fail("fake_verbs_set_retry_without_end_at_7");
  open_side(&g_a);
  open_side(&g_b);
  g_a.peer = &g_b;
  g_b.peer = &g_a;
  const unsigned int access = MR_ACCESS;
  int step = vf_test_rc_connect(g_a.qp, g_b.qp->qp_num, g_b.gid, 1, access);
  if (step) setup_fail("connecting A failed at step %d", step);
  step = vf_test_rc_connect(g_b.qp, g_a.qp->qp_num, g_a.gid, 1, access);
  if (step) setup_fail("connecting B failed at step %d", step);
  printf("QPN A=%u B=%u\n", g_a.qp->qp_num, g_b.qp->qp_num);
  if (g_srq) {
    open_second(&g_a2, &g_a);
    open_second(&g_b2, &g_b);
    g_a2.peer = &g_b2;
    g_b2.peer = &g_a2;
    step = vf_test_rc_connect(g_a2.qp, g_b2.qp->qp_num, g_b2.gid, 1, access);
    if (step) setup_fail("connecting A2 failed at step %d", step);
    step = vf_test_rc_connect(g_b2.qp, g_a2.qp->qp_num, g_a2.gid, 1, access);
    if (step) setup_fail("connecting B2 failed at step %d", step);
    printf("QPN A2=%u B2=%u\n", g_a2.qp->qp_num, g_b2.qp->qp_num);
  }
  /* Connected, no traffic yet: the options that change resources in place do it now. */
  if (g_resize_cq) {
    resize_cqs(&g_a);
    resize_cqs(&g_b);
  }
  if (g_rereg) {
    rereg_side(&g_a);
    rereg_side(&g_b);
  }
  /* The rkeys each side gives the other (the MRs' current ones). */
  g_a.peer_rkey = g_b.mr->rkey;
  g_b.peer_rkey = g_a.mr->rkey;
  if (g_srq) {
    g_a2.peer_rkey = g_b.mr->rkey;
    g_b2.peer_rkey = g_a.mr->rkey;
  }
  post_recvs(&g_a, recvs_a);
  post_recvs(&g_b, recvs_b);
}

/* Traffic both ways before the cut (the pair works, the rings hold history). Consumes 2
   receives on each side (--srq: 2 + STREAM_WARMUP on each SRQ, the second pair's stream
   interleaved). */
static void warmup(void) {
  post_op(&g_a, IBV_WR_SEND, 200, SIG, 0);
  stream(1);
  post_op(&g_b, IBV_WR_SEND, 100, SIG, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 300, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 64, SIG, 0x1111);
  stream(STREAM_WARMUP - 1);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 32, SIG, 0x2222);
  wait_for(all_done, POLL_BOTH, "the warm-up traffic");
}

static void hold_fake0(void) { fv.set_delay(0, BIG_DELAY); }

/* --srq: the second pair's stream goes on around the cut: one message each way right before
   the port dies (held on the wire with the scenario's traffic when fake0 is delayed, else
   delivered with its completions unpolled, or in RNR when B's SRQ is empty), one right after
   (racing the detection). The scenario's cut point was verified before. */
static void do_cut(void) {
  stream(1);
  struct fake_verbs_device_stats d;
  fv.dev_stats(0, &d);
  printf("cut: fake0 %s (fake0 tx=%llu rx=%llu so far)\n",
         g_silent_cut ? "drops every packet, port up" : "port down",
         (unsigned long long)d.tx_messages, (unsigned long long)d.rx_messages);
  fflush(stdout);
  if (g_silent_cut) {
    /* No port event: only the requests' transport retries running out tell anyone. */
    if (fv.set_drop(0, 1) != 0) setup_fail("fake_verbs_set_drop(0)");
  } else if (fv.port_down(0) != 0) {
    setup_fail("fake_verbs_port_down(0)");
  }
  stream(1);
}

/* The region a receiver takes over after the message that announced it: it overwrites it. */
static void take_over(struct side* s, uint32_t first_mem, uint32_t end_mem) {
  for (uint32_t k = first_mem; k < end_mem; ++k) {
    struct exp_mem* m = &g_mem[k];
    if (m->where != s || m->is_read) continue;
    memset(m->where->buf + m->off, MARKER, m->len);
    m->marker = 1;
  }
}

static void quiet_window(void);

/* ------------------------------------------------------------------ scenarios */

/* The port dies with nothing in flight; the application posts a WRITE + WRITE_WITH_IMM (and the
   peer a SEND) right after, racing the shim's detection. */
static void scenario_before_wwi(void) {
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 1000, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0xbef0);
  post_op(&g_b, IBV_WR_SEND, 150, SIG, 0);
  wait_for(all_done, POLL_BOTH, "the traffic posted after the cut");
}

/* WRITE + WRITE_WITH_IMM + READ from A and a SEND_WITH_IMM from B are held on the wire (fake0's
   delay) when the port dies: nothing was delivered, everything must be replayed once. */
static void scenario_during_wwi(void) {
  setup(48, 48);
  warmup();
  const struct fake_verbs_qp_stats a0 = qp_stats(&g_a), b0 = qp_stats(&g_b);
  hold_fake0();
  begin_batch(&g_a);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 2000, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 500, SIG, 0xd0d0);
  post_op(&g_a, IBV_WR_RDMA_READ, 256, SIG, 0);
  end_batch(&g_a);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 80, SIG, 0xb0b0);
  for (int i = 0; i < 5; ++i) fv.progress();
  const struct fake_verbs_qp_stats a1 = qp_stats(&g_a), b1 = qp_stats(&g_b);
  if (a1.messages_sent != a0.messages_sent || b1.messages_sent != b0.messages_sent ||
      b1.messages_received != b0.messages_received)
    setup_fail("the WRs were not held on the wire (A sent %llu->%llu, B sent %llu->%llu)",
               (unsigned long long)a0.messages_sent, (unsigned long long)a1.messages_sent,
               (unsigned long long)b0.messages_sent, (unsigned long long)b1.messages_sent);
  do_cut();
  wait_for(all_done, POLL_BOTH, "the WRs in flight at the cut");
}

/* WRITE + WRITE_WITH_IMM delivered; the receiver polled the notification and took the regions
   over (overwrote them); the sender has NOT polled its completion yet, and a SEND is in flight
   behind it. The fake acknowledges within the step that delivers, so "ack lost" is not
   expressible: the closest case is an acknowledged-but-unpolled completion (see docs). A replay
   of the delivered WRITEs would overwrite the receiver's marker. */
static void scenario_after_wwi(void) {
  setup(48, 48);
  warmup();
  const struct fake_verbs_qp_stats b0 = qp_stats(&g_b);
  const uint32_t mem0 = g_n_mem;
  post_op(&g_a, IBV_WR_RDMA_WRITE, 1500, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 300, SIG, 0xaf7e);
  const struct fake_verbs_qp_stats b1 = qp_stats(&g_b);
  if (b1.messages_received != b0.messages_received + 2)
    setup_fail("the WRITE + WRITE_WITH_IMM were not delivered at once");
  if (wait_for(b_got_all_msgs, POLL_B, "B's notification") != 0) return;
  take_over(&g_b, mem0, g_n_mem);
  hold_fake0();
  post_op(&g_a, IBV_WR_SEND, 120, SIG, 0);
  do_cut();
  wait_for(all_done, POLL_BOTH, "A's completions");
}

/* B's device writes receive completions late (fake_verbs_set_recv_completion_delay on fake2):
   A's SEND is placed at B and acknowledged, and A polls its successful completion (its ring
   retires the request), but B's receive completion is still inside the device when the cut
   comes. The shim's drain must wait for B's receive queue to flush (it posts a marker receive
   after ERR, and a queue completes in order) to count that message as delivered; a drain that
   stops at the first empty poll reports one message fewer, A has nothing left to replay, and
   the message is lost. */
static void scenario_late_recv_cqe(void) {
  setup(48, 48);
  warmup();
  if (fv.set_recv_delay(2, LATE_RECV_CQE_STEPS) != 0)
    setup_fail("fake_verbs_set_recv_completion_delay(2)");
  const struct fake_verbs_qp_stats b0 = qp_stats(&g_b);
  post_op(&g_a, IBV_WR_SEND, 200, SIG, 0);
  if (qp_stats(&g_b).messages_received != b0.messages_received + 1)
    setup_fail("the SEND was not delivered at once");
  if (wait_for(a_got_all_sends, POLL_A, "A's send completion") != 0) return;
  do_cut();
  /* Every poll is a progress step of the fake: polling now could let B's late completion out
     before the shim's switch drains B's old QP, and the run would prove nothing. So, with the
     shim, first wait (reading the fake's state only, no progress) until B's primary is in ERR:
     its drain is under way. */
  if (getenv("LD_PRELOAD") != NULL) {
    const long long deadline = now_ms() + g_timeout_ms;
    struct fake_verbs_qp_stats st;
    while (now_ms() < deadline && fv.qp_stats(g_b.qp->qp_num, &st) == 0 &&
           st.qp_state != IBV_QPS_ERR)
      sched_yield();
  }
  wait_for(all_done, POLL_BOTH, "the late message and every completion");
}

/* Same, but neither side polled anything: the delivered message's receive completion and the
   sender's completion are both still in the provider's CQs at the cut, and A's send queue is
   empty (the fake leaves A's QP in RTS; the shim must move it itself). */
static void scenario_after_wwi_unpolled(void) {
  setup(48, 48);
  warmup();
  const struct fake_verbs_qp_stats b0 = qp_stats(&g_b);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 1500, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 300, SIG, 0xaf7f);
  post_op(&g_b, IBV_WR_SEND, 40, SIG, 0);
  const struct fake_verbs_qp_stats b1 = qp_stats(&g_b);
  if (b1.messages_received != b0.messages_received + 2 || b1.messages_sent != b0.messages_sent + 1)
    setup_fail("the traffic was not delivered at once");
  do_cut();
  wait_for(all_done, POLL_BOTH, "the completions of delivered work");
}

/* 8 unsignaled RDMA_WRITEs + a signaled WRITE_WITH_IMM, cut mid-chain: the first 4 writes were
   executed, the rest and the WRITE_WITH_IMM are held. Before it, a whole chain was delivered and
   taken over by the receiver while the sender never polled its completion (must not replay). */
static void scenario_unsignaled_chain(void) {
  setup(48, 48);
  warmup();
  const uint32_t round1 = g_n_mem;
  begin_batch(&g_a);
  for (int i = 0; i < 8; ++i) post_op(&g_a, IBV_WR_RDMA_WRITE, 700 + 64 * i, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 128, SIG, 0xc001);
  end_batch(&g_a);
  if (wait_for(b_got_all_msgs, POLL_B, "round 1's notification") != 0) return;
  take_over(&g_b, round1, g_n_mem);
  const struct fake_verbs_qp_stats b0 = qp_stats(&g_b);
  begin_batch(&g_a);
  for (int i = 0; i < 4; ++i) post_op(&g_a, IBV_WR_RDMA_WRITE, 900 + 32 * i, 0, 0);
  end_batch(&g_a);
  const struct fake_verbs_qp_stats b1 = qp_stats(&g_b);
  hold_fake0();
  begin_batch(&g_a);
  for (int i = 4; i < 8; ++i) post_op(&g_a, IBV_WR_RDMA_WRITE, 900 + 32 * i, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 256, SIG, 0xc002);
  end_batch(&g_a);
  for (int i = 0; i < 3; ++i) fv.progress();
  const struct fake_verbs_qp_stats b2 = qp_stats(&g_b);
  if (b1.messages_received != b0.messages_received + 4 ||
      b2.messages_received != b1.messages_received)
    setup_fail("the cut is not mid-chain (B received %llu then %llu more)",
               (unsigned long long)(b1.messages_received - b0.messages_received),
               (unsigned long long)(b2.messages_received - b1.messages_received));
  do_cut();
  wait_for(all_done, POLL_BOTH, "the chain");
}

/* Inline SENDs / SEND_WITH_IMM / WRITEs: the application overwrites each buffer as soon as
   post_send returns (flush() does it). Some were delivered before the cut, some are held. A
   replay from the application's buffer instead of the recorded copy delivers 0xee bytes. */
static void scenario_inline(void) {
  setup(48, 48);
  warmup();
  if (g_a.cap.max_inline_data < 100) setup_fail("max_inline_data %u", g_a.cap.max_inline_data);
  post_op(&g_a, IBV_WR_SEND, 100, SIG | INL, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 64, INL, 0);
  post_op(&g_a, IBV_WR_SEND_WITH_IMM, 1, SIG | INL, 0x1a1a);
  hold_fake0();
  post_op(&g_a, IBV_WR_SEND, 100, SIG | INL, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 90, INL, 0);
  post_op(&g_a, IBV_WR_SEND_WITH_IMM, 77, INL, 0x1b1b); /* unsignaled */
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 50, SIG | INL, 0x1c1c);
  post_op(&g_b, IBV_WR_SEND, 60, SIG | INL, 0);
  do_cut();
  wait_for(all_done, POLL_BOTH, "the inline traffic");
}

/* RNR: B has no receive when A's SEND arrives (rnr_retry 7: A retries forever); the port dies,
   then B posts the receives (racing the switch). --srq: B's SRQ is empty, so the second pair's
   A2 -> B2 message posted at the cut is in RNR too; the receives B then posts go to whichever QP
   the SRQ serves first (11 >= 3 + 2 after the cut + 1 + 2 in after_round). */
static void scenario_rnr(void) {
  /* B: exactly the receives the warm-up consumes */
  setup(48, 2 + (g_srq ? STREAM_WARMUP : 0));
  warmup();
  const struct fake_verbs_qp_stats a0 = qp_stats(&g_a), b0 = qp_stats(&g_b);
  post_op(&g_a, IBV_WR_SEND, 200, SIG, 0);
  post_op(&g_a, IBV_WR_SEND_WITH_IMM, 20, SIG, 0x3e3e);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 100, SIG, 0x3f3f);
  for (int i = 0; i < 4; ++i) fv.progress();
  const struct fake_verbs_qp_stats a1 = qp_stats(&g_a), b1 = qp_stats(&g_b);
  if (a1.rnr_naks <= a0.rnr_naks || b1.messages_received != b0.messages_received)
    setup_fail("A's SEND is not in RNR (rnr_naks %llu -> %llu)", (unsigned long long)a0.rnr_naks,
               (unsigned long long)a1.rnr_naks);
  do_cut();
  post_recvs(&g_b, 1);
  for (int i = 0; i < 10; ++i) fv.progress();
  post_recvs(&g_b, 10);
  wait_for(all_done, POLL_BOTH, "the RNR'd messages");
}

/* Whether the shim's log (VERBS_FAILOVER_LOG_FILE) has a line holding both texts. */
static int shim_log_has(const char* first, const char* second) {
  const char* path = getenv("VERBS_FAILOVER_LOG_FILE");
  FILE* file = path != NULL ? fopen(path, "r") : NULL;
  if (file == NULL) return 0;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof line, file) != NULL)
    found = strstr(line, first) != NULL && strstr(line, second) != NULL;
  fclose(file);
  return found;
}

static char g_late_line[96];
static int late_resume_logged(void) { return shim_log_has(g_late_line, "1 request(s) outstanding"); }

/* A replay the new path cannot complete: B has no receive for A's SEND, which RNRs on the
   standby as it did on the primary (rnr_retry 7: retried for ever, no error). The shim must say
   so in its log once the switch is older than its "late" bound (shortened here to 200 ms): the
   request outstanding and the standby QP's state. Then B posts receives and all completes. */
static void scenario_rnr_stall(void) {
  int (*set_late_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_resume_late_ms");
  if (set_late_ms == NULL && getenv("LD_PRELOAD") != NULL)
    setup_fail("the shim is preloaded but verbs_failover_debug_set_resume_late_ms is missing");
  if (set_late_ms == NULL)
    printf("no shim: the late-resume line is not looked for\n");
  else if (set_late_ms(200) != 0)
    setup_fail("verbs_failover_debug_set_resume_late_ms(200)");
  setup(48, 2 + (g_srq ? STREAM_WARMUP : 0));
  warmup();
  const struct fake_verbs_qp_stats a0 = qp_stats(&g_a);
  post_op(&g_a, IBV_WR_SEND, 120, SIG, 0);
  for (int i = 0; i < 4; ++i) fv.progress();
  const struct fake_verbs_qp_stats a1 = qp_stats(&g_a);
  if (a1.rnr_naks <= a0.rnr_naks) setup_fail("A's SEND is not in RNR");
  do_cut();
  if (set_late_ms != NULL) {
    snprintf(g_late_line, sizeof g_late_line, "qp %u: no completion on the standby path",
             g_a.qp->qp_num);
    if (wait_for(late_resume_logged, POLL_BOTH, "the shim's line on A's stalled replay") != 0)
      return;
    printf("the shim described A's stalled replay\n");
  }
  post_recvs(&g_b, 4);
  wait_for(all_done, POLL_BOTH, "the RNR'd SEND");
}

/* A full send queue: max_send_wr WRs (unsignaled WRITEs, signaled SENDs and WRITE_WITH_IMMs) held
   on the wire, one more is refused with ENOMEM; cut; all complete. Then the queue is filled again
   on the new path. */
static void fill_sq(struct side* s, int count) {
  for (int i = 0; i < count; ++i) {
    const int last = i == count - 1;
    if (i % 8 == 7 || last)
      post_op(s, IBV_WR_RDMA_WRITE_WITH_IMM, 96, SIG, 0x5000u + (uint32_t)i);
    else if (i % 8 == 3)
      post_op(s, IBV_WR_SEND, 48, SIG, 0);
    else
      post_op(s, IBV_WR_RDMA_WRITE, 256, 0, 0);
  }
}

static int expect_sq_full(struct side* s) {
  struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = 8, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 0xdeadull, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = (uintptr_t)s->peer->buf + TGT_END - 64;
  wr.wr.rdma.rkey = s->peer_rkey;
  struct ibv_send_wr* bad = NULL;
  return ibv_post_send(s->qp, &wr, &bad);
}

static void scenario_full_sq(void) {
  setup(48, 48);
  warmup();
  const int n = (int)g_a.cap.max_send_wr;
  if (n < 16 || n > MAX_SEND_WR) setup_fail("max_send_wr %d", n);
  hold_fake0();
  fill_sq(&g_a, n);
  const int rc = expect_sq_full(&g_a);
  if (rc != ENOMEM) setup_fail("the send queue is not full: one more post returned %d", rc);
  do_cut();
  if (wait_for(all_done, POLL_BOTH, "the full send queue") != 0) return;
  /* Again on the new path, as one burst. */
  fill_sq(&g_a, n);
  wait_for(all_done, POLL_BOTH, "a second full send queue after the switch");
}

/* The send queue is full on the standby path (held by a delay on fake1) after the switch: one
   more post must be refused with ENOMEM, as the application's QP would. */
static void scenario_full_sq_after_switch(void) {
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_SEND, 10, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "a SEND after the cut") != 0) return;
  /* Let the shim's engine settle (it idles once the switch and its resume are done): a refusal
     it would only catch up on later must show as a loss, not be hidden by its housekeeping. */
  quiet_window();
  fv.set_delay(1, 1000); /* the posting calls themselves are progress steps */
  const int n = (int)g_a.cap.max_send_wr;
  fill_sq(&g_a, n);
  const int rc = expect_sq_full(&g_a);
  if (rc != ENOMEM)
    fail("A: with max_send_wr=%d WRs outstanding on the standby path, one more post returned %d "
         "(%s), expected ENOMEM", n, rc, strerror(rc));
  if (rc == 0) { /* it was accepted: expect its completion too, so the run stays checkable */
    struct exp_send* e = &g_a.sends[g_a.n_sends++];
    e->wr_id = 0xdeadull;
    e->opcode = IBV_WC_RDMA_WRITE;
    e->is_read = 0;
  }
  wait_for(all_done, POLL_BOTH, "the full standby send queue");
}

/* Failback with work in flight on the standby: after the failover, WRs held on fake1's wire
   (delay) when fake0 comes back; the shim switches back (docs/design.md §5 "Failback") and
   whatever the standby had not delivered must be carried by the primary exactly once. */
static void scenario_failback_in_flight(void) {
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_SEND, 10, SIG, 0);
  post_op(&g_b, IBV_WR_SEND, 10, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "traffic after the cut") != 0) return;
  struct fake_verbs_device_stats f0, f1, f1b;
  fv.dev_stats(1, &f1);
  fv.set_delay(1, 3000); /* held on the standby's wire for 3000 progress steps */
  begin_batch(&g_a);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 1200, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0xfb01);
  post_op(&g_a, IBV_WR_RDMA_READ, 64, SIG, 0);
  end_batch(&g_a);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 50, SIG, 0xfb02);
  stream(1); /* --srq: the second pair has work held on the standby too */
  fv.dev_stats(1, &f1b);
  if (f1b.tx_messages != f1.tx_messages) setup_fail("the standby's WRs were not held");
  printf("EXPECT failback\n");
  fv.dev_stats(0, &f0);
  if (fv.port_up(0) != 0) setup_fail("fake_verbs_port_up(0)");
  if (wait_for(all_done, POLL_BOTH, "the WRs in flight on the standby at the failback") != 0)
    return;
  fv.set_delay(1, 0);
  /* Rounds until the primary carries traffic again (the failback is the shim's to time, on its
     own thread). Each round consumes a receive on each side, so rounds are spread over the time
     bound (a round costs microseconds; a busy machine may not run the shim's thread for
     milliseconds): between rounds the fake makes progress and this thread yields. */
  const long long deadline = now_ms() + g_timeout_ms;
  const long long spacing_ms = g_timeout_ms / 40;
  struct fake_verbs_device_stats now;
  for (int round = 0;; ++round) {
    for (const long long next = now_ms() + (round > 0 ? spacing_ms : 0); now_ms() < next;) {
      fv.progress();
      fv.dev_stats(0, &now);
      if (now.tx_messages > f0.tx_messages) break;
      sched_yield();
    }
    post_op(&g_a, IBV_WR_SEND_WITH_IMM, 16, SIG, 0xfb10);
    post_op(&g_b, IBV_WR_RDMA_WRITE_WITH_IMM, 16, SIG, 0xfb11);
    if (wait_for(all_done, POLL_BOTH, "traffic after the port came back") != 0) return;
    fv.dev_stats(0, &now);
    if (now.tx_messages > f0.tx_messages) break;
    if (now_ms() > deadline || recvs_left(&g_b) < 4 || recvs_left(&g_a) < 4) {
      fail("the primary (fake0) carried no traffic after its port came back (no failback)");
      return;
    }
  }
}

/* ------------------------------------------------------------------ standby_blink */

/* The shim's view of a QP (verbs_failover_debug_qp_protected): 1 protected, 0 not, -1 unknown.
   NULL without the shim (the noshim twin): the blinks are then not observed, only survived. */
typedef int (*qp_protected_fn)(uint32_t qpn, char* reason, size_t reason_size);
static qp_protected_fn g_qp_protected;

struct protection_want {
  struct side* side;
  int state;          /* 1 protected, 0 not */
  const char* reason; /* with state 0: a part of the reason it must give */
};

static int protection_holds(const struct protection_want* w, char* reason, size_t size) {
  reason[0] = '\0';
  const int state = g_qp_protected(w->side->qp->qp_num, reason, size);
  return state == w->state && (w->state != 0 || strstr(reason, w->reason) != NULL);
}

/* Polls (progress steps) until the shim says of every listed QP what is wanted; bounded. */
static int wait_protection(const struct protection_want* want, int n, const char* what) {
  if (g_qp_protected == NULL) return 0;
  const long long deadline = now_ms() + g_timeout_ms;
  char reason[256];
  for (;;) {
    int held = 0;
    if (poll_side(&g_a) + poll_side(&g_b) == 0) sched_yield();
    for (int i = 0; i < n; ++i) held += protection_holds(&want[i], reason, sizeof reason);
    if (held == n) {
      printf("shim: %s\n", what);
      return 0;
    }
    if (now_ms() > deadline) break;
  }
  for (int i = 0; i < n; ++i) {
    if (protection_holds(&want[i], reason, sizeof reason)) continue;
    const int state = g_qp_protected(want[i].side->qp->qp_num, reason, sizeof reason);
    fail("timeout (%d ms) waiting until %s: the shim says QP %s is %s (%s); wanted %s %s",
         g_timeout_ms, what, want[i].side->name,
         state == 1 ? "protected" : state == 0 ? "unprotected" : "unknown to it", reason,
         want[i].state ? "protected" : "unprotected, for a reason naming",
         want[i].state ? "" : want[i].reason);
  }
  return -1;
}

/* The standby's port goes down and comes back while the primary carries the traffic, on each
   side in turn (fake1 holds A's standby, fake3 B's). While it is down both shims must report
   both QPs unprotected: the side whose own ports are all up learns it from its peer (PathStatus);
   without that it would count on a standby that cannot carry anything. Once it is up both QPs
   must be protected again: the path is re-armed whichever of the two ends asks for re-arming (the
   two blinks give each role to the side whose port blinked once), at once, not at the shim's
   re-arm retry (set to 10 minutes here). Traffic runs, and is checked, all along. Then fake0
   dies: the failover must go over the re-armed standby. */
static void scenario_standby_blink(void) {
  g_qp_protected = (qp_protected_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  int (*set_rearm_retry_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_rearm_retry_ms");
  if (g_qp_protected == NULL || set_rearm_retry_ms == NULL) {
    g_qp_protected = NULL;
    printf("no shim: the standby blinks are not observed\n");
  } else if (set_rearm_retry_ms(REARM_RETRY_MS) != 0) {
    setup_fail("verbs_failover_debug_set_rearm_retry_ms(%d)", REARM_RETRY_MS);
  }
  setup(48, 48);
  warmup();
  const struct protection_want all_protected[2] = {{&g_a, 1, NULL}, {&g_b, 1, NULL}};
  if (wait_protection(all_protected, 2, "A and B are protected") != 0) return;
  static const struct {
    int device;
    struct side* owner;
    const char* own_reason;
  } kBlinks[2] = {{1, &g_a, "standby path's port fake1/1 is down"},
                  {3, &g_b, "standby path's port fake3/1 is down"}};
  for (int i = 0; i < 2; ++i) {
    const int device = kBlinks[i].device;
    struct side* owner = kBlinks[i].owner;
    printf("blink: fake%d (%s's standby) port down\n", device, owner->name);
    if (fv.port_down(device) != 0) setup_fail("fake_verbs_port_down(%d)", device);
    const struct protection_want lost[2] = {
        {owner, 0, kBlinks[i].own_reason},
        {owner->peer, 0, "the peer's end of its standby path lost its port"}};
    if (wait_protection(lost, 2, "both QPs say their standby is lost") != 0) return;
    post_op(&g_a, IBV_WR_RDMA_WRITE, 700, 0, 0);
    post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 120, SIG, 0x5b01u + (unsigned)i);
    stream(1);
    post_op(&g_b, IBV_WR_SEND, 60, SIG, 0);
    if (wait_for(all_done, POLL_BOTH, "traffic on the primary while a standby port is down") != 0)
      return;
    printf("blink: fake%d port up\n", device);
    if (fv.port_up(device) != 0) setup_fail("fake_verbs_port_up(%d)", device);
    /* The side that asks for re-arms asked while the port was down and got no answer; its retry
       is set far beyond this wait, so the path must come back because the answering side said
       its port is back (or, when the asker's own port blinked, because it asked). */
    if (wait_protection(all_protected, 2, "A and B are protected again") != 0) return;
  }
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 900, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 200, SIG, 0x5bf0);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 150, SIG, 0x5bf1);
  wait_for(all_done, POLL_BOTH, "the traffic posted after the cut");
}

/* A silent cut that is repaired: fake0 drops everything (no port event), the shims switch on
   RETRY_EXC and hold fake0's path down (here for 300 ms instead of 10 s) and say both QPs are
   unprotected meanwhile; fake0 is repaired; once the hold ends the path is re-armed, both QPs are
   protected again and fail back; traffic then runs on it. A hold that never ended, or a re-arm
   that never came, leaves the QPs unprotected past the wait. */
static void scenario_silent_cut_repaired(void) {
  g_qp_protected = (qp_protected_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_qp_protected");
  int (*set_hold_ms)(unsigned) =
      (int (*)(unsigned))dlsym(RTLD_DEFAULT, "verbs_failover_debug_set_hold_down_ms");
  if (g_qp_protected == NULL || set_hold_ms == NULL) {
    g_qp_protected = NULL;
    printf("no shim: the hold-down is not observed\n");
  } else if (set_hold_ms(300) != 0) {
    setup_fail("verbs_failover_debug_set_hold_down_ms(300)");
  }
  g_silent_cut = 1;
  setup(48, 48);
  warmup();
  do_cut();
  post_op(&g_a, IBV_WR_RDMA_WRITE, 600, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 90, SIG, 0x7a01);
  post_op(&g_b, IBV_WR_SEND, 70, SIG, 0);
  if (wait_for(all_done, POLL_BOTH, "the traffic posted after the silent cut") != 0) return;
  const struct protection_want held[2] = {{&g_a, 0, "held down"}, {&g_b, 0, "held down"}};
  if (wait_protection(held, 2, "both QPs say their primary is held down") != 0) return;
  printf("repair: fake0 stops dropping\n");
  if (fv.set_drop(0, 0) != 0) setup_fail("fake_verbs_set_drop(0, 0)");
  const struct protection_want back[2] = {{&g_a, 1, NULL}, {&g_b, 1, NULL}};
  if (wait_protection(back, 2, "A and B are protected again") != 0) return;
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 110, SIG, 0x7a02);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 50, SIG, 0x7a03);
  wait_for(all_done, POLL_BOTH, "the traffic after the repair");
}

/* No cut at all: a sanity run of the traffic (and, with --srq, of the SRQ stream) and of the
   checker on the fake, without the shim (run_exactly_once.sh plain: must PASS). */
static void scenario_no_cut(void) {
  setup(48, 48);
  warmup();
  begin_batch(&g_a);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 2000, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 500, SIG, 0x0c01);
  post_op(&g_a, IBV_WR_RDMA_READ, 256, SIG, 0);
  end_batch(&g_a);
  stream(2);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 80, SIG, 0x0c02);
  post_op(&g_b, IBV_WR_SEND, 70, 0, 0);
  stream(2);
  wait_for(all_done, POLL_BOTH, "the traffic");
}

/* ------------------------------------------------------------------ final checks */

static void after_round(void) {
  /* Traffic both ways on whatever path now carries it. Its completions come after any replayed
     or stashed one (RC order on one path), so it also bounds the wait for stragglers. */
  post_op(&g_a, IBV_WR_RDMA_WRITE, 400, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 100, SIG, 0xf00a);
  stream(1);
  post_op(&g_a, IBV_WR_RDMA_READ, 128, SIG, 0);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 90, SIG, 0xf00b);
  stream(1);
  post_op(&g_b, IBV_WR_RDMA_WRITE, 333, SIG, 0);
  wait_for(all_done, POLL_BOTH, "traffic after the failover");
}

static void quiet_window(void) {
  /* Nothing more may arrive: a late duplicate would show here. */
  const long long until = now_ms() + 100;
  int polls = 0;
  while (polls < 400 || now_ms() < until) {
    if (poll_side(&g_a) + poll_side(&g_b) == 0) sched_yield();
    ++polls;
    if (now_ms() > until + g_timeout_ms) break;
  }
}

static void check_memory(void) {
  for (uint32_t k = 0; k < g_n_mem; ++k) {
    const struct exp_mem* m = &g_mem[k];
    const long bad = check_mem_entry(m);
    if (bad < 0) continue;
    if (m->is_read)
      fail("%s: RDMA_READ destination at %#x wrong at byte %ld", m->where->name, m->off, bad);
    else if (m->marker)
      fail("%s: region at %#x (len %u) the application took over after its notification was "
           "overwritten again at byte %ld: a delivered RDMA WRITE was REPLAYED", m->where->name,
           m->off, m->len, bad);
    else
      fail("%s: RDMA WRITE target at %#x (len %u) wrong at byte %ld (0x%02x)", m->where->name,
           m->off, m->len, bad, m->where->buf[m->off + bad]);
  }
}

/* --srq, at the end: every consumed receive's buffer is as its completion left it (no second
   message was written into it, even one whose completion never surfaced), and the SRQ lost or
   invented no consumption: consumed receives == receive-consuming messages of both QPs. */
static void check_srq_final(struct side* h) {
  int consumed = 0;
  for (int k = 0; k < h->n_recvs; ++k) {
    const struct posted_recv* r = &h->recvs[k];
    if (!r->by) continue;
    ++consumed;
    if (slot_hash(h, r->slot) != r->hash)
      fail("%s's SRQ: receive wr_id=%#llx (slot %u), consumed by %s message #%d, was written "
           "again after its completion (%s): its buffer was handed to another message",
           h->name, (unsigned long long)r->wr_id, r->slot, r->by->name, r->msg,
           srq_buffer_holds(h, r->slot));
  }
  const struct side* h2 = h->pair2;
  if (consumed != h->n_msgs + h2->n_msgs)
    fail("%s's SRQ: %d receive(s) consumed, but %d receive-consuming message(s) were sent to %s "
         "and %s (%d + %d received)", h->name, consumed, h->n_msgs + h2->n_msgs, h->name,
         h2->name, h->got_msgs, h2->got_msgs);
}

static void check_qp_and_events(struct side* s) {
  struct ibv_qp_attr attr;
  struct ibv_qp_init_attr init;
  memset(&attr, 0, sizeof attr);
  const int rc = ibv_query_qp(s->qp, &attr, IBV_QP_STATE, &init);
  if (rc != 0)
    fail("%s: ibv_query_qp failed: %s", s->name, strerror(rc));
  else if (attr.qp_state != IBV_QPS_RTS)
    fail("%s: ibv_query_qp reports state %d, expected RTS (%d)", s->name, attr.qp_state,
         IBV_QPS_RTS);
  if (s->qp->state != IBV_QPS_RTS)
    fail("%s: qp->state is %d, expected RTS", s->name, s->qp->state);
  const int flags = fcntl(s->ctx->async_fd, F_GETFL);
  if (flags < 0 || fcntl(s->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    fail("%s: cannot make the async fd non-blocking", s->name);
    return;
  }
  for (int i = 0; i < 8; ++i) {
    struct ibv_async_event ev;
    if (ibv_get_async_event(s->ctx, &ev) != 0) {
      if (errno != EAGAIN) fail("%s: ibv_get_async_event: %s", s->name, strerror(errno));
      break;
    }
    fail("%s: async event reached the application: %s", s->name, ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
  }
}

/* ------------------------------------------------------------------ selftest of the checker */

static void reset_model(void) {
  struct side* sides[4] = {&g_a, &g_b, &g_a2, &g_b2};
  for (int i = 0; i < 4; ++i) {
    struct side* s = sides[i];
    s->n_sends = s->got_sends = s->n_msgs = s->got_msgs = s->n_recvs = 0;
    s->src_next = SRC_BASE;
    s->tgt_next = TGT_BASE;
    s->batch_n = 0;
    s->stream_seq = 0;
  }
  g_n_mem = 0;
}

/* Builds expectations without any device: A sends 3 messages to B; returns the completions a
   correct run delivers (A: sends; B: receives), which the cases then corrupt. */
struct fake_run {
  struct ibv_wc a[16], b[16];
  int na, nb;
  void (*late)(void); /* runs after the completions, before the final checks */
};

static void model_run(struct fake_run* r) {
  reset_model();
  g_a.batching = g_b.batching = 1; /* record only */
  uint64_t w[3];
  w[0] = post_op(&g_a, IBV_WR_SEND, 40, SIG, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 64, 0, 0);
  w[1] = post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 16, SIG, 0x77);
  w[2] = post_op(&g_a, IBV_WR_SEND_WITH_IMM, 24, SIG, 0x78);
  g_a.batch_n = 0;
  /* what the wire would do */
  for (int k = 0; k < 3; ++k) {
    g_b.recvs[k].wr_id = g_b.wr_base + 0x800000ull + (uint64_t)k;
    g_b.recvs[k].slot = (uint32_t)k;
  }
  g_b.n_recvs = 3;
  fill_pattern(g_b.buf + RECV_BASE, 40, g_b.msgs[0].seed);
  fill_pattern(g_b.buf + RECV_BASE + 2 * RECV_SLOT, 24, g_b.msgs[2].seed);
  for (uint32_t k = 0; k < g_n_mem; ++k)
    fill_pattern(g_mem[k].where->buf + g_mem[k].off, g_mem[k].len, g_mem[k].seed);
  memset(r, 0, sizeof *r);
  const enum ibv_wc_opcode sop[3] = {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_SEND};
  const enum ibv_wc_opcode rop[3] = {IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_RECV};
  const uint32_t len[3] = {40, 16, 24}, imm[3] = {0, 0x77, 0x78};
  for (int k = 0; k < 3; ++k) {
    r->a[k] = (struct ibv_wc){.wr_id = w[k], .status = IBV_WC_SUCCESS, .opcode = sop[k],
                              .qp_num = g_a.qp->qp_num};
    r->b[k] = (struct ibv_wc){.wr_id = g_b.recvs[k].wr_id, .status = IBV_WC_SUCCESS,
                              .opcode = rop[k], .byte_len = len[k], .qp_num = g_b.qp->qp_num,
                              .imm_data = htonl(imm[k]),
                              .wc_flags = imm[k] ? IBV_WC_WITH_IMM : 0};
  }
  r->na = r->nb = 3;
}

/* --srq model: A2 -> B2 exist too, and B's SRQ holds 6 receives (one stays spare). A sends the
   3 messages above to B, A2 sends 2 stream messages to B2; the wire delivers B#0, B2#0, B#1,
   B2#1, B#2 (kSrqOrder) into the receives assign[0..4] (in post order: 0 1 2 3 4). A's SRQ has
   2 receives nobody consumes. r->a: the send completions of A and A2 (one CQ), r->b: the
   receive completions of B and B2 (one CQ), in delivery order. */
static const int kSrqOrder[5][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}}; /* {B2?, msg} */
static const int kSrqInOrder[5] = {0, 1, 2, 3, 4};

static void model_run_srq(struct fake_run* r, const int assign[5]) {
  reset_model();
  memset(g_a.buf + RECV_BASE, 0, RECV_SLOTS * RECV_SLOT);
  memset(g_b.buf + RECV_BASE, 0, RECV_SLOTS * RECV_SLOT);
  g_a.batching = g_b.batching = g_a2.batching = g_b2.batching = 1; /* record only */
  post_op(&g_a, IBV_WR_SEND, 40, SIG, 0);
  stream_msg(&g_a2);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 64, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 16, SIG, 0x77);
  stream_msg(&g_a2);
  post_op(&g_a, IBV_WR_SEND_WITH_IMM, 24, SIG, 0x78);
  g_a.batch_n = g_a2.batch_n = 0;
  struct side* homes[2] = {&g_a, &g_b};
  for (int h = 0; h < 2; ++h) {
    struct side* s = homes[h];
    s->n_recvs = s == &g_b ? 6 : 2;
    for (int k = 0; k < s->n_recvs; ++k)
      s->recvs[k] = (struct posted_recv){.wr_id = s->wr_base + 0x800000ull + (uint64_t)k,
                                         .slot = (uint32_t)k, .msg = -1};
  }
  for (uint32_t k = 0; k < g_n_mem; ++k)
    fill_pattern(g_mem[k].where->buf + g_mem[k].off, g_mem[k].len, g_mem[k].seed);
  memset(r, 0, sizeof *r);
  for (int i = 0; i < 5; ++i) { /* the wire */
    struct side* q = kSrqOrder[i][0] ? &g_b2 : &g_b;
    const struct exp_msg* m = &q->msgs[kSrqOrder[i][1]];
    const struct posted_recv* rv = &g_b.recvs[assign[i]];
    if (m->carries_payload) fill_pattern(g_b.buf + RECV_BASE + rv->slot * RECV_SLOT, m->len, m->seed);
    r->b[r->nb++] = (struct ibv_wc){.wr_id = rv->wr_id, .status = IBV_WC_SUCCESS,
                                    .opcode = m->opcode, .byte_len = m->len,
                                    .qp_num = q->qp->qp_num, .imm_data = htonl(m->imm),
                                    .wc_flags = m->with_imm ? IBV_WC_WITH_IMM : 0};
  }
  for (int i = 0; i < 3; ++i) { /* A's and A2's send completions, interleaved */
    const struct side* q[2] = {&g_a, &g_a2};
    for (int k = 0; k < 2; ++k) {
      if (i >= q[k]->n_sends) continue;
      const struct exp_send* e = &q[k]->sends[i];
      r->a[r->na++] = (struct ibv_wc){.wr_id = e->wr_id, .status = IBV_WC_SUCCESS,
                                      .opcode = e->opcode, .qp_num = q[k]->qp->qp_num};
    }
  }
}

/* The receive completion of B2's message #m in r->b. */
static int srq_b2(const struct fake_run* r, int m) {
  for (int i = 0; i < r->nb; ++i)
    if (r->b[i].qp_num == g_b2.qp->qp_num && m-- == 0) return i;
  return 0;
}

static void drop_wc(struct ibv_wc* wc, int* n, int i) {
  for (int k = i; k + 1 < *n; ++k) wc[k] = wc[k + 1];
  --*n;
}

/* B's receive completions first, then B2's (each QP's own order kept). */
static void b2_after_b(struct fake_run* r) {
  struct ibv_wc sorted[16];
  int n = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < r->nb; ++i)
      if ((r->b[i].qp_num == g_b2.qp->qp_num) == (pass == 1)) sorted[n++] = r->b[i];
  memcpy(r->b, sorted, sizeof(struct ibv_wc) * (size_t)n);
}

static void clobber_b_slot0(void) { g_b.buf[RECV_BASE + 3] ^= 0x40; }

static int feed(struct fake_run* r) {
  const int before = g_failures;
  for (int k = 0; k < r->na; ++k) on_wc(qp_owner(&g_a, &r->a[k]), &r->a[k]);
  for (int k = 0; k < r->nb; ++k) on_wc(qp_owner(&g_b, &r->b[k]), &r->b[k]);
  if (r->late) r->late();
  if (!all_done()) ++g_failures; /* what wait_for reports as a timeout */
  check_memory();
  if (g_srq) {
    check_srq_final(&g_a);
    check_srq_final(&g_b);
  }
  return g_failures - before;
}

static int selftest(void) {
  static struct ibv_qp qa, qb, qa2, qb2;
  static struct ibv_mr ma, mb;
  qa.qp_num = 11;
  qb.qp_num = 22;
  qa2.qp_num = 33;
  qb2.qp_num = 44;
  g_a.qp = &qa;
  g_b.qp = &qb;
  g_a2.qp = &qa2;
  g_b2.qp = &qb2;
  g_a.mr = &ma;
  g_b.mr = &mb;
  g_a.peer = &g_b;
  g_b.peer = &g_a;
  if (posix_memalign((void**)&g_a.buf, 64, BUF_SIZE) || posix_memalign((void**)&g_b.buf, 64, BUF_SIZE))
    return 3;
  memset(g_a.buf, 0, BUF_SIZE);
  memset(g_b.buf, 0, BUF_SIZE);
  struct fake_run r;
  int bad = 0;
  g_quiet = 1;
#define CASE(name, mutate, want_fail)                                           \
  do {                                                                          \
    model_run(&r);                                                              \
    mutate;                                                                     \
    const int f = feed(&r);                                                     \
    if ((f > 0) != (want_fail)) {                                               \
      printf("selftest %-34s %s (failures=%d)\n", name, "WRONG", f);            \
      ++bad;                                                                    \
    } else {                                                                    \
      printf("selftest %-34s ok (%s)\n", name, f ? "caught" : "clean");         \
    }                                                                           \
  } while (0)
  CASE("correct run", (void)0, 0);
  CASE("duplicate send completion", (r.a[3] = r.a[1], r.na = 4), 1);
  CASE("duplicate last send completion", (r.a[3] = r.a[2], r.na = 4), 1);
  CASE("lost send completion", (r.a[1] = r.a[2], r.na = 2), 1);
  CASE("lost last send completion", (r.na = 2), 1);
  CASE("send completions reordered", (r.a[0] = r.a[1], r.a[1].wr_id = g_a.sends[0].wr_id), 1);
  CASE("wrong send opcode", (r.a[1].opcode = IBV_WC_SEND), 1);
  CASE("error send completion", (r.a[2].status = IBV_WC_RETRY_EXC_ERR), 1);
  CASE("flush error completion", (r.a[2].status = IBV_WC_WR_FLUSH_ERR), 1);
  CASE("wrong qp_num (standby's)", (r.a[0].qp_num = 99), 1);
  CASE("duplicate receive (same receive)", (r.b[3] = r.b[1], r.nb = 4), 1);
  CASE("duplicate message (next receive)",
       (r.b[3] = r.b[2], r.b[2] = r.b[1], r.b[2].wr_id = g_b.recvs[2].wr_id, r.nb = 3), 1);
  CASE("lost receive", (r.nb = 2), 1);
  CASE("lost middle message", (r.b[1] = r.b[2], r.b[1].wr_id = g_b.recvs[1].wr_id, r.nb = 2), 1);
  CASE("wrong imm", (r.b[1].imm_data = htonl(0x99)), 1);
  CASE("missing imm flag", (r.b[2].wc_flags = 0), 1);
  CASE("wrong byte_len", (r.b[0].byte_len = 41), 1);
  CASE("payload from a reused inline buffer",
       (memset(g_b.buf + RECV_BASE, CLOBBER, 40)), 1);
  CASE("write not visible at its notification",
       (g_b.buf[g_mem[0].off] ^= 1), 1);
  CASE("replayed write over a taken-over region",
       (take_over(&g_b, 0, g_n_mem), g_b.buf[g_mem[0].off] = 0), 1);
  CASE("taken-over region intact", (take_over(&g_b, 0, g_n_mem)), 0);
#undef CASE
  /* --srq: the same rules on two QPs sharing B's SRQ, plus the SRQ's own. */
  g_srq = 1;
  g_a.pair2 = &g_a2;
  g_b.pair2 = &g_b2;
  g_a2.mr = &ma;
  g_b2.mr = &mb;
  g_a2.buf = g_a.buf;
  g_b2.buf = g_b.buf;
  g_a2.peer = &g_b2;
  g_b2.peer = &g_a2;
#define SRQ_CASE(name, assign, mutate, want_fail)                               \
  do {                                                                          \
    model_run_srq(&r, assign);                                                  \
    mutate;                                                                     \
    const int f = feed(&r);                                                     \
    if ((f > 0) != (want_fail)) {                                               \
      printf("selftest srq: %-34s %s (failures=%d)\n", name, "WRONG", f);       \
      ++bad;                                                                    \
    } else {                                                                    \
      printf("selftest srq: %-34s ok (%s)\n", name, f ? "caught" : "clean");    \
    }                                                                           \
  } while (0)
  static const int kSwapped[5] = {1, 0, 2, 4, 3}; /* receives taken out of post order */
  SRQ_CASE("correct run", kSrqInOrder, (void)0, 0);
  SRQ_CASE("receives taken out of post order", kSwapped, (void)0, 0);
  SRQ_CASE("QPs' completions interleaved otherwise", kSrqInOrder,
           (b2_after_b(&r)), 0);
  SRQ_CASE("same SRQ receive consumed twice", kSrqInOrder,
           (r.b[srq_b2(&r, 1)].wr_id = r.b[0].wr_id), 1);
  SRQ_CASE("same receive twice (payload moved)", kSrqInOrder,
           (r.b[srq_b2(&r, 1)].wr_id = r.b[0].wr_id,
            fill_pattern(g_b.buf + RECV_BASE, g_b2.msgs[1].len, g_b2.msgs[1].seed)), 1);
  SRQ_CASE("receive wr_id never posted", kSrqInOrder,
           (r.b[1].wr_id = g_b.wr_base + 0x800000ull + 40), 1);
  SRQ_CASE("receive of the other side's SRQ", kSrqInOrder, (r.b[1].wr_id = g_a.recvs[0].wr_id),
           1);
  SRQ_CASE("message delivered twice (spare recv)", kSrqInOrder,
           (r.b[5] = r.b[srq_b2(&r, 0)], r.b[5].wr_id = g_b.recvs[5].wr_id,
            fill_pattern(g_b.buf + RECV_BASE + 5 * RECV_SLOT, g_b2.msgs[0].len, g_b2.msgs[0].seed),
            r.nb = 6), 1);
  SRQ_CASE("lost message of the second pair", kSrqInOrder, (drop_wc(r.b, &r.nb, srq_b2(&r, 1))),
           1);
  SRQ_CASE("lost message of the main pair", kSrqInOrder, (drop_wc(r.b, &r.nb, 4)), 1);
  SRQ_CASE("payload not in the named receive", kSrqInOrder,
           (r.b[0].wr_id = g_b.recvs[2].wr_id, r.b[2].wr_id = g_b.recvs[0].wr_id), 1);
  SRQ_CASE("consumed buffer written again", kSrqInOrder, (r.late = clobber_b_slot0), 1);
  SRQ_CASE("second pair: duplicate send completion", kSrqInOrder,
           (r.a[r.na] = r.a[1], ++r.na), 1);
  SRQ_CASE("second pair: main QP's qp_num", kSrqInOrder,
           (r.b[srq_b2(&r, 0)].qp_num = g_b.qp->qp_num), 1);
  SRQ_CASE("second pair: error receive completion", kSrqInOrder,
           (r.b[srq_b2(&r, 1)].status = IBV_WC_WR_FLUSH_ERR), 1);
  SRQ_CASE("second pair: wrong imm", kSrqInOrder,
           (r.b[srq_b2(&r, 0)].imm_data = htonl(0x2a000002)), 1);
  SRQ_CASE("second pair: messages swapped", kSrqInOrder,
           (r.b[7] = r.b[srq_b2(&r, 0)], r.b[srq_b2(&r, 0)] = r.b[srq_b2(&r, 1)],
            r.b[srq_b2(&r, 1)] = r.b[7]), 1);
#undef SRQ_CASE
  g_srq = 0;
  g_a.pair2 = g_b.pair2 = NULL;
  g_quiet = 0;
  printf("%s selftest: %d wrong\n", bad ? "FAIL:" : "PASS", bad);
  return bad ? 1 : 0;
}

/* ------------------------------------------------------------------ main */

struct scenario {
  const char* name;
  void (*run)(void);
};

static const struct scenario kScenarios[] = {
    {"before_wwi", scenario_before_wwi},
    {"during_wwi", scenario_during_wwi},
    {"after_wwi", scenario_after_wwi},
    {"after_wwi_unpolled", scenario_after_wwi_unpolled},
    {"late_recv_cqe", scenario_late_recv_cqe},
    {"unsignaled_chain", scenario_unsignaled_chain},
    {"inline", scenario_inline},
    {"rnr", scenario_rnr},
    {"rnr_stall", scenario_rnr_stall},
    {"silent_cut_repaired", scenario_silent_cut_repaired},
    {"full_sq", scenario_full_sq},
    {"full_sq_after_switch", scenario_full_sq_after_switch},
    {"failback_in_flight", scenario_failback_in_flight},
    {"standby_blink", scenario_standby_blink},
    {"no_cut", scenario_no_cut},
};

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s SCENARIO|selftest [--wr-api] [--sig-all] [--split-cq] [--srq] [--cq-ex] "
            "[--rereg] [--resize-cq] [--ece] [--rxe-flush] [--timeout-ms N]\n",
            argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], "--wr-api") == 0)
      g_wr_api = 1;
    else if (strcmp(argv[i], "--sig-all") == 0)
      g_sig_all = 1;
    else if (strcmp(argv[i], "--split-cq") == 0)
      g_split_cq = 1;
    else if (strcmp(argv[i], "--srq") == 0)
      g_srq = 1;
    else if (strcmp(argv[i], "--cq-ex") == 0)
      g_cq_ex = 1;
    else if (strcmp(argv[i], "--rereg") == 0)
      g_rereg = 1;
    else if (strcmp(argv[i], "--resize-cq") == 0)
      g_resize_cq = 1;
    else if (strcmp(argv[i], "--ece") == 0)
      g_ece = 1;
    else if (strcmp(argv[i], "--rxe-flush") == 0)
      g_rxe_flush = 1;
    else if (strcmp(argv[i], "--silent-cut") == 0)
      g_silent_cut = 1;
    else if (strcmp(argv[i], "--rxe-retry") == 0)
      g_rxe_retry = 1;
    else if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc)
      g_timeout_ms = atoi(argv[++i]);
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (strcmp(argv[1], "selftest") == 0) {
    if (g_srq) {
      fprintf(stderr, "selftest covers --srq itself\n");
      return 2;
    }
    if (g_cq_ex || g_rereg || g_resize_cq || g_ece) {
      fprintf(stderr, "selftest feeds completions to the checker directly: no CQ, no MR\n");
      return 2;
    }
    return selftest();
  }
  if (g_ece && g_srq) {
    /* the shim's SRQ sweep uses QPs of its own on the backup devices: not the application's */
    fprintf(stderr, "--ece checks every QP on the fabric: not with --srq\n");
    return 2;
  }
  const struct scenario* sc = NULL;
  for (size_t i = 0; i < sizeof kScenarios / sizeof kScenarios[0]; ++i)
    if (strcmp(kScenarios[i].name, argv[1]) == 0) sc = &kScenarios[i];
  if (!sc) {
    fprintf(stderr, "unknown scenario %s\n", argv[1]);
    return 2;
  }
  fv.port_down = (int (*)(int))fake_sym("fake_verbs_port_down");
  fv.port_up = (int (*)(int))fake_sym("fake_verbs_port_up");
  fv.set_delay = (int (*)(int, unsigned))fake_sym("fake_verbs_set_delay");
  fv.progress = (void (*)(void))fake_sym("fake_verbs_progress");
  fv.qp_stats = (int (*)(uint32_t, struct fake_verbs_qp_stats*))fake_sym("fake_verbs_query_qp_stats");
  fv.dev_stats =
      (int (*)(int, struct fake_verbs_device_stats*))fake_sym("fake_verbs_query_device_stats");
  fv.list_qps = (int (*)(int, uint32_t*, int))fake_sym("fake_verbs_list_qps");
  fv.set_recv_delay = (int (*)(int, unsigned))fake_sym("fake_verbs_set_recv_completion_delay");
  fv.set_flush_on_modify_only = (int (*)(int, int))fake_sym("fake_verbs_set_flush_on_modify_only");
  fv.set_drop = (int (*)(int, int))fake_sym("fake_verbs_set_drop");
  fv.set_retry_without_end_at_7 =
      (int (*)(int, int))fake_sym("fake_verbs_set_retry_without_end_at_7");
  fv.device_count = (int (*)(void))fake_sym("fake_verbs_device_count");
  fv.reset = (void (*)(void))fake_sym("fake_verbs_reset");

  sc->run();
  if (g_failures == 0) after_round();
  if (g_failures == 0) quiet_window();
  check_memory();
  check_poison(&g_a);
  check_poison(&g_b);
  check_qp_and_events(&g_a);
  check_qp_and_events(&g_b);
  if (g_ece) check_ece();
  if (g_srq) {
    check_srq_final(&g_a);
    check_srq_final(&g_b);
    check_qp_and_events(&g_a2);
    check_qp_and_events(&g_b2);
  }
  struct fake_verbs_device_stats standby;
  fv.dev_stats(1, &standby);
  printf("fake1 (A's standby device) carried %llu message(s)\n",
         (unsigned long long)standby.tx_messages);
  if (g_cq_ex)
    printf("cq-ex: %ld start_poll..end_poll cycle(s) with completions, %ld ended after %d "
           "without draining\n", g_cq_ex_cycles, g_cq_ex_left_early, CQ_EX_BATCH);
  if (g_failures) {
    /* The fake's view of every QP of the run (the application's and the shim's standbys), to
       help diagnose a failure. */
    const uint32_t last = g_srq ? g_b2.qp->qp_num : g_b.qp->qp_num;
    for (uint32_t q = g_a.qp->qp_num; q <= last + 1; ++q) {
      struct fake_verbs_qp_stats st;
      if (fv.qp_stats(q, &st) != 0) continue;
      printf("fake qp %u: sent=%llu received=%llu rnr_naks=%llu transport_retries=%llu "
             "error_completions=%llu\n", q, (unsigned long long)st.messages_sent,
             (unsigned long long)st.messages_received, (unsigned long long)st.rnr_naks,
             (unsigned long long)st.transport_retries,
             (unsigned long long)st.completions_with_error);
    }
    printf("FAIL: scenario %s%s%s%s%s%s: %d failure(s)\n", sc->name,
           g_wr_api ? " (ibv_wr_* API)" : "", g_srq ? " (SRQ)" : "",
           g_cq_ex ? " (extended CQs)" : "", g_rereg ? " (MRs re-registered)" : "",
           g_resize_cq ? " (CQs resized)" : "", g_failures);  /* --ece: see the "ece:" lines */
    return 1;
  }
  char pair2[96] = "";
  if (g_srq)
    snprintf(pair2, sizeof pair2, ", A2 %d sends %d msgs, B2 %d sends %d msgs", g_a2.n_sends,
             g_a2.n_msgs, g_b2.n_sends, g_b2.n_msgs);
  printf("PASS scenario %s%s%s%s%s%s%s%s%s: A %d sends %d msgs, B %d sends %d msgs%s\n", sc->name,
         g_wr_api ? " (ibv_wr_* API)" : "", g_sig_all ? " (sq_sig_all)" : "",
         g_split_cq ? " (split CQs)" : "", g_srq ? " (SRQ)" : "",
         g_cq_ex ? " (extended CQs)" : "", g_rereg ? " (MRs re-registered)" : "",
         g_resize_cq ? " (CQs resized)" : "", g_ece ? " (ECE set)" : "", g_a.n_sends, g_a.n_msgs,
         g_b.n_sends, g_b.n_msgs, pair2);
  return 0;
}
