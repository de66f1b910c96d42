/* The traffic of vf_exactly_once: send WRs (post_op() records each one's expectations for the
   checker; batches; the --wr-api path), receives (to the QP or to --srq's SRQ), the --srq second
   pair's stream, polling the CQs (--cq-ex: the iterator) into the checker, bounded waits, and
   the rounds every scenario shares: warmup() before the cut, after_round() and quiet_window()
   after it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "tests/failover/exactly_once.h"

static uint32_t g_seed = 1000;
long g_cq_ex_cycles = 0, g_cq_ex_left_early = 0; /* --cq-ex: reported at the end */

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
  if (len == 0 && (flags & ZSGE)) {
    s->batch_sge[i].lkey = 0xbad5ee ^ (uint32_t)wr_id;
    wr->num_sge = 1;
  }
  if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) {
    wr->wr.rdma.remote_addr = (uintptr_t)(peer->buf + tgt);
    wr->wr.rdma.rkey = s->peer_rkey;
    if (len == 0) {
      /* A zero-length RDMA carries no address or rkey the responder checks (IBA C9-88), and
         programs leave them unset: rsockets' control messages are zero-length WRITE_WITH_IMMs
         whose rkey is stack garbage. */
      wr->wr.rdma.remote_addr = 0;
      wr->wr.rdma.rkey = 0xbadc0de ^ (uint32_t)wr_id;
    }
  }
  if (!s->batching) flush(s);
  return wr_id;
}

uint64_t post_op(struct side* s, enum ibv_wr_opcode op, uint32_t len, int flags,
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

void begin_batch(struct side* s) { s->batching = 1; }
void end_batch(struct side* s) {
  s->batching = 0;
  flush(s);
}

/* Posts `count` receives to the side's QP, or (--srq) to its SRQ; `s` is A or B (a home). */
void post_recvs(struct side* s, int count) {
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
void stream_msg(struct side* s) {
  const uint32_t seq = ++s->stream_seq;
  const uint32_t tag = 0x20000000u | (s == &g_a2 ? 0x0a000000u : 0x0b000000u) | (seq & 0xffffffu);
  const uint32_t len = 8 + seq * 13 % 57;
  if (seq % 2 == 1)
    post_op_seed(s, IBV_WR_SEND_WITH_IMM, len, SIG, tag, tag);
  else
    post_op_seed(s, IBV_WR_SEND, len, seq % 4 == 0 ? 0 : SIG, 0, tag);
}

void stream(int rounds) {
  if (!g_srq) return;
  for (int i = 0; i < rounds; ++i) {
    stream_msg(&g_a2);
    stream_msg(&g_b2);
  }
}

/* Receives still free for messages (posted minus expected consumers of the queue). */
int recvs_left(const struct side* s) {
  return s->n_recvs - s->n_msgs - (s->pair2 ? s->pair2->n_msgs : 0);
}

/* ------------------------------------------------------------------ polling */

/* --srq: A2 (B2) completes on A's (B's) CQs; the completion's qp_num tells whose it is. Anything
   not A2's (B2's) is checked as A's (B's), which rejects a foreign qp_num. */
struct side* qp_owner(struct side* s, const struct ibv_wc* wc) {
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

int poll_side(struct side* s) {
  int n = poll_cq(s, s->cq);
  if (s->rcq != s->cq) n += poll_cq(s, s->rcq);
  return n;
}

static int side_done(const struct side* s) {
  return s->got_sends == s->n_sends && s->got_msgs == s->n_msgs;
}

int all_done(void) {
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

/* --events: what a program that sleeps on its channel does when the channel's fd is readable:
   get the event, ack it, re-arm the CQ, poll it until empty (A: every event until EAGAIN; B: one
   per wake-up, its fd blocks). Nothing is polled unless the fd says so. */
static int on_channel(struct side* s) {
  struct pollfd pfd = {.fd = s->channel->fd, .events = POLLIN};
  if (poll(&pfd, 1, 0) != 1) return 0;
  int n = 0;
  for (;;) {
    struct ibv_cq* cq = NULL;
    void* context = NULL;
    if (ibv_get_cq_event(s->channel, &cq, &context) != 0) {
      if (s == &g_a && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      fail("%s: ibv_get_cq_event: %s", s->name, strerror(errno));
      break;
    }
    if ((cq != s->cq && cq != s->rcq) || context != s) {
      fail("%s: ibv_get_cq_event gave cq %p context %p", s->name, (void*)cq, context);
      break;
    }
    ++s->cq_events;
    ibv_ack_cq_events(cq, 1);
    if (ibv_req_notify_cq(cq, 0) != 0) fail("%s: ibv_req_notify_cq", s->name);
    for (int k; (k = poll_cq(s, cq)) > 0;) n += k;
    if (s != &g_a) break;
  }
  return n;
}

/* --events, before the teardown: one event got and not yet acknowledged, as a program holds one
   between ibv_get_cq_event and ibv_ack_cq_events (its completion polled). Returns its CQ, or
   NULL after a failure. */
struct ibv_cq* hold_one_event(struct side* s) {
  if (g_failures) return NULL; /* the run already failed: its QPs may be in error */
  if (ibv_req_notify_cq(s->cq, 0) != 0) fail("%s: ibv_req_notify_cq", s->name);
  const int want = s->n_sends + 1;
  post_op(s, IBV_WR_RDMA_WRITE, 16, SIG, 0);
  struct ibv_cq* cq = NULL;
  const long long deadline = now_ms() + g_timeout_ms;
  while (cq == NULL && now_ms() < deadline) {
    fv.progress();
    struct pollfd pfd = {.fd = s->channel->fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 1) {
      sched_yield();
      continue;
    }
    void* context = NULL;
    if (ibv_get_cq_event(s->channel, &cq, &context) != 0) {
      fail("%s: ibv_get_cq_event: %s", s->name, strerror(errno));
      return NULL;
    }
  }
  if (cq == NULL) {
    fail("%s: no event for a signaled write within %d ms", s->name, g_timeout_ms);
    return NULL;
  }
  ++s->cq_events;
  while (s->got_sends < want && now_ms() < deadline) {
    fv.progress();
    if (poll_cq(s, s->cq) == 0) sched_yield();
  }
  if (s->got_sends < want) fail("%s: the held event's write never completed", s->name);
  return cq;
}

/* Polls (each poll is a progress step of the fake) until cond() holds; stops early on a failure
   so that a broken run ends at once. 0 = reached. With --events it polls only the CQs whose
   channel woke, and the fake's own progress stands in for the NIC working by itself. */
int wait_for(int (*cond)(void), int which, const char* what) {
  const long long deadline = now_ms() + g_timeout_ms;
  const int failures = g_failures;
  for (;;) {
    int got = 0;
    if (g_events) {
      fv.progress();
      if (which & POLL_A) got += on_channel(&g_a);
      if (which & POLL_B) got += on_channel(&g_b);
    } else {
      if (which & POLL_A) got += poll_side(&g_a);
      if (which & POLL_B) got += poll_side(&g_b);
    }
    if (g_failures != failures) return -1;
    if (cond()) return 0;
    if (now_ms() > deadline) {
      report_progress(what);
      return -1;
    }
    if (got == 0) sched_yield(); /* let the shim's engine thread run */
  }
}

int b_got_all_msgs(void) { return g_b.got_msgs == g_b.n_msgs; }
int a_got_all_sends(void) { return g_a.got_sends == g_a.n_sends; }

struct fake_verbs_qp_stats qp_stats(struct side* s) {
  struct fake_verbs_qp_stats st;
  memset(&st, 0, sizeof st);
  if (fv.qp_stats(s->qp->qp_num, &st) != 0) setup_fail("fake_verbs_query_qp_stats");
  return st;
}

/* Traffic both ways before the cut (the pair works, the rings hold history). Consumes 2
   receives on each side (--srq: 2 + STREAM_WARMUP on each SRQ, the second pair's stream
   interleaved). */
void warmup(void) {
  post_op(&g_a, IBV_WR_SEND, 200, SIG, 0);
  stream(1);
  post_op(&g_b, IBV_WR_SEND, 100, SIG, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 300, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 64, SIG, 0x1111);
  stream(STREAM_WARMUP - 1);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 32, SIG, 0x2222);
  wait_for(all_done, POLL_BOTH, "the warm-up traffic");
}

void after_round(void) {
  /* Traffic both ways on whatever path now carries it. Its completions come after any replayed
     or stashed one (RC order on one path), so it also bounds the wait for stragglers. */
  post_op(&g_a, IBV_WR_RDMA_WRITE, 400, 0, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 100, SIG, 0xf00a);
  stream(1);
  post_op(&g_a, IBV_WR_RDMA_READ, 128, SIG, 0);
  post_op(&g_b, IBV_WR_SEND_WITH_IMM, 90, SIG, 0xf00b);
  stream(1);
  post_op(&g_b, IBV_WR_RDMA_WRITE, 333, SIG, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE, 0, SIG, 0); /* no rkey to translate (rsockets' control) */
  post_op(&g_b, IBV_WR_RDMA_WRITE, 0, SIG | ZSGE, 0); /* nor an lkey */
  wait_for(all_done, POLL_BOTH, "traffic after the failover");
}

void quiet_window(void) {
  /* Nothing more may arrive: a late duplicate would show here. */
  const long long until = now_ms() + 100;
  int polls = 0;
  while (polls < 400 || now_ms() < until) {
    if (poll_side(&g_a) + poll_side(&g_b) == 0) sched_yield();
    ++polls;
    if (now_ms() > until + g_timeout_ms) break;
  }
}
