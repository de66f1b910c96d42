/* The selftest of vf_exactly_once's checker (`vf_exactly_once selftest`): expectations built
   without any device, a correct run's completions fed to the checker, then the same run with
   completions and buffers duplicated, lost, reordered or corrupted: each must be caught. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/failover/exactly_once.h"

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

int selftest(void) {
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
