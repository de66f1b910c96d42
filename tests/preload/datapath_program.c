/* Exercises every data-path entry a provider publishes — ibv_context.ops (post_send, post_recv,
   post_srq_recv, poll_cq, req_notify_cq), verbs_context (query_port, query_device_ex,
   create_qp_ex, create_cq_ex), the ibv_wr_* API of an extended QP and the start/next/end_poll API
   of an extended CQ — between two RC QPs on --dev-a and --dev-b (the same device is fine: a QP
   pair on one port loops back). Side A uses a classic CQ with a completion channel and an
   extended QP; side B an extended CQ, a classic QP and a shared receive queue.

   It prints a transcript of everything the application can observe (completions, attributes,
   received bytes). Values that legitimately differ from run to run on real devices (QP numbers,
   keys) are printed relative to each other unless --raw is given. The preload tests run it with
   and without the shim and require identical transcripts: that is "exact pass-through".
   Lines starting with "OPS " say which object serves each published function (dladdr); they
   are excluded from the comparison and checked separately.

   Usage: datapath_program --dev-a NAME --dev-b NAME [--gid-index N] [--raw] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>

#include "tests/common/rc_connect.h"
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUF_SIZE 65536
#define TIMEOUT_MS 10000

static int g_raw = 0;

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf(" (errno=%d %s)\n", errno, strerror(errno));
  va_end(ap);
  fflush(stdout);
  exit(1);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char* object_of(void* fn) {
  Dl_info info;
  if (fn == NULL) return "(null)";
  if (dladdr(fn, &info) == 0 || info.dli_fname == NULL) return "(unknown)";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

struct side {
  const char* label;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_mr* mr;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_qp_ex* qpx; /* NULL when the provider has no ibv_wr_* API */
  struct ibv_comp_channel* channel;
  struct ibv_cq_ex* cqx; /* B: the extended CQ behind cq */
  struct ibv_srq* srq;   /* B: receives go to a shared receive queue */
  union ibv_gid gid;
  unsigned char* buf;
};

static struct side g_a = {.label = "A"}, g_b = {.label = "B"};

static const char* qp_label(uint32_t qpn) {
  if (g_a.qp && qpn == g_a.qp->qp_num) return "A";
  if (g_b.qp && qpn == g_b.qp->qp_num) return "B";
  return "?";
}

static void print_wc(const char* side, const struct ibv_wc* wc) {
  printf("WC %s wr_id=%llu status=%s opcode=%d byte_len=%u imm=%#x wc_flags=%#x qp=%s\n", side,
         (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status), (int)wc->opcode,
         wc->byte_len, (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0, wc->wc_flags,
         qp_label(wc->qp_num));
}

/* Polls until `count` completions arrived or the deadline passed (a hang is a failure). */
/* The extended CQ's way: start_poll, read_* accessors, next_poll, end_poll. */
static void poll_n_ex(struct side* s, int count) {
  const long long deadline = now_ms() + TIMEOUT_MS;
  int got = 0;
  while (got < count) {
    struct ibv_poll_cq_attr attr = {0};
    int rc = ibv_start_poll(s->cqx, &attr);
    if (rc == ENOENT) {
      if (now_ms() > deadline) die("timeout waiting for %d completions on %s", count, s->label);
      continue;
    }
    if (rc) die("ibv_start_poll on %s returned %d", s->label, rc);
    for (;;) {
      struct ibv_wc wc;
      memset(&wc, 0, sizeof(wc));
      wc.wr_id = s->cqx->wr_id;
      wc.status = s->cqx->status;
      wc.opcode = ibv_wc_read_opcode(s->cqx);
      wc.wc_flags = ibv_wc_read_wc_flags(s->cqx);
      wc.byte_len = ibv_wc_read_byte_len(s->cqx);
      wc.qp_num = ibv_wc_read_qp_num(s->cqx);
      if (wc.wc_flags & IBV_WC_WITH_IMM) wc.imm_data = ibv_wc_read_imm_data(s->cqx);
      print_wc(s->label, &wc);
      if (++got >= count) break;
      rc = ibv_next_poll(s->cqx);
      if (rc == ENOENT) break;
      if (rc) die("ibv_next_poll on %s returned %d", s->label, rc);
    }
    ibv_end_poll(s->cqx);
  }
}

static void poll_n(struct side* s, int count) {
  if (s->cqx) {
    poll_n_ex(s, count);
    return;
  }
  const long long deadline = now_ms() + TIMEOUT_MS;
  int got = 0;
  while (got < count) {
    struct ibv_wc wc[8];
    const int n = ibv_poll_cq(s->cq, 8, wc);
    if (n < 0) die("ibv_poll_cq on %s returned %d", s->label, n);
    for (int i = 0; i < n; ++i) print_wc(s->label, &wc[i]);
    got += n;
    if (n == 0 && now_ms() > deadline) die("timeout waiting for %d completions on %s", count, s->label);
  }
}

static void open_side(struct side* s, struct ibv_device* dev, int gid_index) {
  s->ctx = ibv_open_device(dev);
  if (!s->ctx) die("ibv_open_device %s", ibv_get_device_name(dev));
  struct ibv_device_attr dattr;
  if (ibv_query_device(s->ctx, &dattr)) die("ibv_query_device");
  printf("DEVICE %s max_qp_wr=%d max_sge=%d max_cqe=%d max_mr_size_nonzero=%d atomic_cap=%d\n",
         s->label, dattr.max_qp_wr, dattr.max_sge, dattr.max_cqe, dattr.max_mr_size != 0,
         (int)dattr.atomic_cap);
  struct ibv_device_attr_ex xattr;
  memset(&xattr, 0, sizeof(xattr));
  int rc = ibv_query_device_ex(s->ctx, NULL, &xattr);
  printf("DEVICE_EX %s rc=%d max_qp_wr=%d\n", s->label, rc, rc ? -1 : xattr.orig_attr.max_qp_wr);
  struct ibv_port_attr pattr;
  if (ibv_query_port(s->ctx, 1, &pattr)) die("ibv_query_port");
  printf("PORT %s state=%s active_mtu=%d link_layer=%d gid_tbl_len=%d\n", s->label,
         ibv_port_state_str(pattr.state), (int)pattr.active_mtu, (int)pattr.link_layer,
         pattr.gid_tbl_len);
  if (ibv_query_gid(s->ctx, 1, gid_index, &s->gid)) die("ibv_query_gid");
  printf("GID %s index=%d nonzero=%d\n", s->label, gid_index,
         s->gid.global.interface_id != 0 || s->gid.global.subnet_prefix != 0);
  s->pd = ibv_alloc_pd(s->ctx);
  if (!s->pd) die("ibv_alloc_pd");
  s->buf = aligned_alloc(4096, BUF_SIZE);
  memset(s->buf, 0, BUF_SIZE);
  s->mr = ibv_reg_mr(s->pd, s->buf, BUF_SIZE,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!s->mr) die("ibv_reg_mr");
  if (g_raw) {
    /* Key values are the provider's allocation order (the shim's mirrored registrations take
       some): only their presence is part of the transcript. */
    printf("MR %s keys_nonzero=%d length=%zu\n", s->label, s->mr->lkey != 0 && s->mr->rkey != 0,
           s->mr->length);
  } else {
    printf("MR %s length=%zu addr_ok=%d\n", s->label, s->mr->length, s->mr->addr == s->buf);
  }
  s->channel = ibv_create_comp_channel(s->ctx);
  if (!s->channel) die("ibv_create_comp_channel");
  if (s == &g_b) {
    struct ibv_cq_init_attr_ex cattr;
    memset(&cattr, 0, sizeof(cattr));
    cattr.cqe = 64;
    cattr.cq_context = s;
    cattr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM;
    s->cqx = ibv_create_cq_ex(s->ctx, &cattr);
    if (!s->cqx) die("ibv_create_cq_ex");
    s->cq = ibv_cq_ex_to_cq(s->cqx);
    struct ibv_srq_init_attr sattr;
    memset(&sattr, 0, sizeof(sattr));
    sattr.srq_context = s;
    sattr.attr.max_wr = 32;
    sattr.attr.max_sge = 1;
    s->srq = ibv_create_srq(s->pd, &sattr);
    if (!s->srq) die("ibv_create_srq");
    printf("SRQ %s srq_context_ok=%d\n", s->label, s->srq->srq_context == s);
  } else {
    s->cq = ibv_create_cq(s->ctx, 64, s, s->channel, 0);
    if (!s->cq) die("ibv_create_cq");
  }
  printf("CQ %s cqe_at_least_64=%d cq_context_ok=%d\n", s->label, s->cq->cqe >= 64,
         s->cq->cq_context == s);
}

static void create_qp(struct side* s, int extended) {
  struct ibv_qp_init_attr_ex attr;
  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = s->cq;
  attr.recv_cq = s->cq;
  attr.cap.max_send_wr = 32;
  attr.cap.max_recv_wr = 32;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 64;
  attr.pd = s->pd;
  attr.qp_context = s;
  attr.srq = s->srq;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD;
  if (extended) {
    attr.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_READ;
  }
  s->qp = ibv_create_qp_ex(s->ctx, &attr);
  if (!s->qp) die("ibv_create_qp_ex (%s)", extended ? "send ops" : "plain");
  s->qpx = extended ? ibv_qp_to_qp_ex(s->qp) : NULL;
  printf("QP %s type=%d state=%d qp_context_ok=%d extended=%d max_inline_ge_64=%d\n", s->label,
         (int)s->qp->qp_type, (int)s->qp->state, s->qp->qp_context == s, s->qpx != NULL,
         attr.cap.max_inline_data >= 64);
}

static void connect_qp(struct side* s, const struct side* peer, int gid_index) {
  const int step = vf_test_rc_connect(s->qp, peer->qp->qp_num, peer->gid, gid_index,
                                      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                          IBV_ACCESS_LOCAL_WRITE);
  if (step) die("%s of %s", step == 1 ? "INIT" : step == 2 ? "RTR" : "RTS", s->label);
  struct ibv_qp_attr q;
  struct ibv_qp_init_attr qi;
  if (ibv_query_qp(s->qp, &q, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN, &qi))
    die("ibv_query_qp");
  printf("QP_STATE %s state=%d field_state=%d mtu=%d dest_is_peer=%d\n", s->label, (int)q.qp_state,
         (int)s->qp->state, (int)q.path_mtu, q.dest_qp_num == peer->qp->qp_num);
}

static void post_recv(struct side* s, uint64_t wr_id, size_t offset, uint32_t length) {
  struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + offset), .length = length, .lkey = s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = length ? &sge : NULL, .num_sge = length ? 1 : 0};
  struct ibv_recv_wr* bad = NULL;
  int rc = s->srq ? ibv_post_srq_recv(s->srq, &wr, &bad) : ibv_post_recv(s->qp, &wr, &bad);
  if (rc) die("%s rc=%d", s->srq ? "ibv_post_srq_recv" : "ibv_post_recv", rc);
}

static void post_send(struct side* s, uint64_t wr_id, enum ibv_wr_opcode op, size_t offset,
                      uint32_t length, uint64_t remote, uint32_t rkey, uint32_t imm, int flags) {
  struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + offset), .length = length, .lkey = s->mr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = flags;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  struct ibv_send_wr* bad = NULL;
  int rc = ibv_post_send(s->qp, &wr, &bad);
  if (rc) die("ibv_post_send op=%d rc=%d", (int)op, rc);
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(seed * 31 + i * 7);
}

static void expect_bytes(const char* what, const unsigned char* got, const unsigned char* want, size_t n) {
  const int same = memcmp(got, want, n) == 0;
  printf("DATA %s %s\n", what, same ? "match" : "MISMATCH");
  if (!same) die("data mismatch in %s", what);
}

static void report_ops(void) {
  struct verbs_context* v = verbs_get_ctx(g_a.ctx);
  printf("OPS post_send %s\n", object_of((void*)g_a.ctx->ops.post_send));
  printf("OPS post_recv %s\n", object_of((void*)g_a.ctx->ops.post_recv));
  printf("OPS poll_cq %s\n", object_of((void*)g_a.ctx->ops.poll_cq));
  printf("OPS req_notify_cq %s\n", object_of((void*)g_a.ctx->ops.req_notify_cq));
  if (v) {
    printf("OPS query_port %s\n", object_of((void*)v->query_port));
    printf("OPS create_qp_ex %s\n", object_of((void*)v->create_qp_ex));
    printf("OPS query_device_ex %s\n", object_of((void*)v->query_device_ex));
  }
  struct verbs_context* vb = verbs_get_ctx(g_b.ctx);
  printf("OPS post_srq_recv %s\n", object_of((void*)g_b.ctx->ops.post_srq_recv));
  if (vb) printf("OPS create_cq_ex %s\n", object_of((void*)vb->create_cq_ex));
  printf("OPS start_poll %s\n", object_of((void*)g_b.cqx->start_poll));
  printf("OPS next_poll %s\n", object_of((void*)g_b.cqx->next_poll));
  if (g_a.qpx) {
    printf("OPS wr_start %s\n", object_of((void*)g_a.qpx->wr_start));
    printf("OPS wr_rdma_write_imm %s\n", object_of((void*)g_a.qpx->wr_rdma_write_imm));
    printf("OPS wr_set_sge %s\n", object_of((void*)g_a.qpx->wr_set_sge));
    printf("OPS wr_complete %s\n", object_of((void*)g_a.qpx->wr_complete));
  }
}

int main(int argc, char** argv) {
  const char* dev_a = NULL;
  const char* dev_b = NULL;
  int gid_index = 1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--dev-a") && i + 1 < argc) dev_a = argv[++i];
    else if (!strcmp(argv[i], "--dev-b") && i + 1 < argc) dev_b = argv[++i];
    else if (!strcmp(argv[i], "--gid-index") && i + 1 < argc) gid_index = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--raw")) g_raw = 1;
  }
  if (!dev_a || !dev_b) {
    fprintf(stderr, "usage: %s --dev-a NAME --dev-b NAME [--gid-index N] [--raw]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list) die("ibv_get_device_list");
  struct ibv_device *da = NULL, *db = NULL;
  for (int i = 0; i < num; ++i) {
    if (!strcmp(ibv_get_device_name(list[i]), dev_a)) da = list[i];
    if (!strcmp(ibv_get_device_name(list[i]), dev_b)) db = list[i];
  }
  if (!da || !db) die("devices %s/%s not found among %d", dev_a, dev_b, num);
  open_side(&g_a, da, gid_index);
  open_side(&g_b, db, gid_index);
  create_qp(&g_a, 1);
  create_qp(&g_b, 0);
  connect_qp(&g_a, &g_b, gid_index);
  connect_qp(&g_b, &g_a, gid_index);
  report_ops();

  /* 1. SEND into a posted receive. */
  post_recv(&g_b, 100, 0, 4096);
  fill(g_a.buf, 128, 1);
  post_send(&g_a, 1, IBV_WR_SEND, 0, 128, 0, 0, 0, IBV_SEND_SIGNALED);
  poll_n(&g_a, 1);
  poll_n(&g_b, 1);
  expect_bytes("send", g_b.buf, g_a.buf, 128);

  /* 2. NCCL's pattern: unsignaled RDMA_WRITEs, then a signaled WRITE_WITH_IMM into a zero-SGE
        receive. */
  post_recv(&g_b, 101, 0, 0);
  fill(g_a.buf + 8192, 4 * 1024, 2);
  for (int i = 0; i < 3; ++i) {
    post_send(&g_a, 10 + i, IBV_WR_RDMA_WRITE, 8192 + i * 1024, 1024,
              (uintptr_t)g_b.buf + 8192 + i * 1024, g_b.mr->rkey, 0, 0);
  }
  post_send(&g_a, 13, IBV_WR_RDMA_WRITE_WITH_IMM, 8192 + 3 * 1024, 1024,
            (uintptr_t)g_b.buf + 8192 + 3 * 1024, g_b.mr->rkey, 0x1234, IBV_SEND_SIGNALED);
  poll_n(&g_a, 1);
  poll_n(&g_b, 1);
  expect_bytes("write", g_b.buf + 8192, g_a.buf + 8192, 4096);

  /* 3. RDMA_READ back from B. */
  fill(g_b.buf + 16384, 2048, 3);
  post_send(&g_a, 20, IBV_WR_RDMA_READ, 20000, 2048, (uintptr_t)g_b.buf + 16384, g_b.mr->rkey, 0,
            IBV_SEND_SIGNALED);
  poll_n(&g_a, 1);
  expect_bytes("read", g_a.buf + 20000, g_b.buf + 16384, 2048);

  /* 4. Inline SEND: the buffer is overwritten right after posting, the peer must see the
        original bytes. */
  post_recv(&g_b, 102, 24576, 4096);
  unsigned char original[48];
  fill(g_a.buf + 30000, 48, 4);
  memcpy(original, g_a.buf + 30000, 48);
  post_send(&g_a, 30, IBV_WR_SEND, 30000, 48, 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  memset(g_a.buf + 30000, 0xEE, 48);
  poll_n(&g_a, 1);
  poll_n(&g_b, 1);
  expect_bytes("inline", g_b.buf + 24576, original, 48);

  /* 5. The ibv_wr_* API: WRITE_WITH_IMM and an inline SEND in one batch. */
  if (g_a.qpx) {
    post_recv(&g_b, 103, 0, 0);
    post_recv(&g_b, 104, 40000, 4096);
    fill(g_a.buf + 32768, 1024, 5);
    ibv_wr_start(g_a.qpx);
    g_a.qpx->wr_id = 40;
    g_a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write_imm(g_a.qpx, g_b.mr->rkey, (uintptr_t)g_b.buf + 32768, htonl(0x5678));
    ibv_wr_set_sge(g_a.qpx, g_a.mr->lkey, (uintptr_t)g_a.buf + 32768, 1024);
    g_a.qpx->wr_id = 41;
    g_a.qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    ibv_wr_send(g_a.qpx);
    ibv_wr_set_inline_data(g_a.qpx, g_a.buf + 32768, 32);
    int rc = ibv_wr_complete(g_a.qpx);
    printf("WR_COMPLETE rc=%d\n", rc);
    if (rc) die("ibv_wr_complete");
    poll_n(&g_a, 2);
    poll_n(&g_b, 2);
    expect_bytes("wr_api_write", g_b.buf + 32768, g_a.buf + 32768, 1024);
    expect_bytes("wr_api_inline", g_b.buf + 40000, g_a.buf + 32768, 32);
  }

  /* 6. Completion channel: arm, post, sleep in poll(2) on the channel fd, get and ack. */
  if (ibv_req_notify_cq(g_a.cq, 0)) die("ibv_req_notify_cq");
  post_recv(&g_b, 105, 0, 4096);
  post_send(&g_a, 50, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
  struct pollfd pfd = {.fd = g_a.channel->fd, .events = POLLIN};
  int ready = poll(&pfd, 1, TIMEOUT_MS);
  printf("CHANNEL ready=%d\n", ready);
  if (ready != 1) die("completion channel did not wake up");
  struct ibv_cq* ev_cq = NULL;
  void* ev_ctx = NULL;
  if (ibv_get_cq_event(g_a.channel, &ev_cq, &ev_ctx)) die("ibv_get_cq_event");
  printf("CQ_EVENT cq_ok=%d context_ok=%d\n", ev_cq == g_a.cq, ev_ctx == &g_a);
  ibv_ack_cq_events(ev_cq, 1);
  poll_n(&g_a, 1);
  poll_n(&g_b, 1);

  /* 7. The other direction: B sends into a receive A posted (A's post_recv, B's send completion
        through the extended CQ). */
  post_recv(&g_a, 200, 50000, 4096);
  fill(g_b.buf + 50000, 256, 7);
  post_send(&g_b, 60, IBV_WR_SEND, 50000, 256, 0, 0, 0, IBV_SEND_SIGNALED);
  poll_n(&g_b, 1);
  poll_n(&g_a, 1);
  expect_bytes("reverse_send", g_a.buf + 50000, g_b.buf + 50000, 256);

  /* Teardown, in the order programs do it. */
  struct side* sides[2] = {&g_a, &g_b};
  for (int i = 0; i < 2; ++i) {
    struct side* s = sides[i];
    if (ibv_destroy_qp(s->qp)) die("ibv_destroy_qp");
    if (s->srq && ibv_destroy_srq(s->srq)) die("ibv_destroy_srq");
    if (ibv_destroy_cq(s->cq)) die("ibv_destroy_cq");
    if (ibv_destroy_comp_channel(s->channel)) die("ibv_destroy_comp_channel");
    if (ibv_dereg_mr(s->mr)) die("ibv_dereg_mr");
    if (ibv_dealloc_pd(s->pd)) die("ibv_dealloc_pd");
    if (ibv_close_device(s->ctx)) die("ibv_close_device");
    free(s->buf);
  }
  ibv_free_device_list(list);
  printf("PASS\n");
  return 0;
}
