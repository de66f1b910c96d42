/* The checker of vf_exactly_once (what it checks: the top comment of exactly_once.c): fail() and
   setup_fail(), the payload patterns, the model's state (the four sides, the expected memory),
   the check of every completion against the expectations post_op() recorded, and the final
   checks (memory, --srq receive buffers, QP state and async events, --rereg poison, --ece). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/failover/exactly_once.h"

#define FAKE_DEVICES 4
#define MARKER 0x5a

/* ------------------------------------------------------------------ reporting */

int g_failures = 0;
int g_quiet = 0; /* selftest: count failures without printing */
const char* g_scenario = "?";

void fail(const char* fmt, ...) {
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

void setup_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("SETUP: [%s] ", g_scenario);
  vprintf(fmt, ap);
  printf(" (errno=%d %s)\n", errno, strerror(errno));
  va_end(ap);
  fflush(stdout);
  exit(3);
}

long long now_ms(void) {
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

void fill_pattern(uint8_t* p, uint32_t len, uint32_t seed) {
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

struct side g_a = {.name = "A", .dev_index = 0, .wr_base = 0xa000000000ull, .home = &g_a};
struct side g_b = {.name = "B", .dev_index = 2, .wr_base = 0xb000000000ull, .home = &g_b};
/* --srq: the second pair, on A's and B's SRQs (and CQs) */
struct side g_a2 = {.name = "A2", .dev_index = 0, .wr_base = 0xa200000000ull, .home = &g_a};
struct side g_b2 = {.name = "B2", .dev_index = 2, .wr_base = 0xb200000000ull, .home = &g_b};
struct exp_mem g_mem[MAX_EXP];
uint32_t g_n_mem = 0;

/* ------------------------------------------------------------------ completion checks */

const char* wc_desc(const struct ibv_wc* wc) {
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

void on_wc(struct side* s, const struct ibv_wc* wc) {
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

/* The region a receiver takes over after the message that announced it: it overwrites it. */
void take_over(struct side* s, uint32_t first_mem, uint32_t end_mem) {
  for (uint32_t k = first_mem; k < end_mem; ++k) {
    struct exp_mem* m = &g_mem[k];
    if (m->where != s || m->is_read) continue;
    memset(m->where->buf + m->off, MARKER, m->len);
    m->marker = 1;
  }
}

/* ------------------------------------------------------------------ final checks */

void check_memory(void) {
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
void check_srq_final(struct side* h) {
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

void check_qp_and_events(struct side* s) {
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
    /* A GID table that did change is the NIC's news, not the fault's: the application gets it
       with or without the shim (NCCL only logs it). Only where the scenario changed one. */
    if (ev.event_type == IBV_EVENT_GID_CHANGE && g_gid_changed_on == s->dev_index) {
      printf("%s: async event %s (the scenario moved a GID)\n", s->name,
             ibv_event_type_str(ev.event_type));
    } else {
      fail("%s: async event reached the application: %s", s->name,
           ibv_event_type_str(ev.event_type));
    }
    ibv_ack_async_event(&ev);
  }
}

/* --rereg, at the end: the first buffer holds nothing but its poison. */
void check_poison(const struct side* s) {
  if (!s->buf_old) return;
  const long bad = check_pattern(s->buf_old, BUF_SIZE, POISON_SEED + (uint32_t)s->dev_index);
  if (bad >= 0)
    fail("%s: the buffer its MR was moved away from (ibv_rereg_mr) was written at offset %#lx "
         "(0x%02x): a request went through a stale, pre-rereg registration", s->name,
         (unsigned long)bad, s->buf_old[bad]);
}

/* --ece, at the end: every QP on the fabric runs with the option the application chose. */
void check_ece(void) {
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
