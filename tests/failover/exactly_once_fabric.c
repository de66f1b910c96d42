/* The fake fabric of vf_exactly_once: the fake's control API (fv, looked up at the start), and
   setup(): devices, PDs, MRs, CQs (--split-cq, --cq-ex, --resize-cq), SRQs and the second pair
   (--srq), QPs (--wr-api, --sig-all, --ece), the connections, --rereg's move to a second
   buffer, and the first receives. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/rc_connect.h"
#include "tests/failover/exactly_once.h"

#define MAX_RECV_WR 64
#define MAX_INLINE 128
#define CQ_SIZE 512
#define CQ_INITIAL 16 /* --resize-cq: cqe at creation, before ibv_resize_cq to CQ_SIZE */
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define ECE_VENDOR 0xfa4eu   /* --ece: the fake's vendor id */
#define ECE_DEFAULT 0x3u     /* --ece: the options a new fake QP has */
#define CQ_EX_WC_FLAGS                                                                      \
  (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |                   \
   IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |                         \
   IBV_WC_EX_WITH_DLID_PATH_BITS)
#define SRQ_MAX_WR 256  /* --srq: outstanding receives per SRQ (the scenarios keep < 64) */

/* ------------------------------------------------------------------ fake control API */

struct fake_control fv;

static void* fake_sym(const char* name) {
  void* p = dlvsym(RTLD_DEFAULT, name, FAKE_VERBS_CONTROL_VERSION);
  if (p == NULL) {
    printf("SETUP: %s@%s not found: not running on the fake libibverbs\n", name,
           FAKE_VERBS_CONTROL_VERSION);
    exit(3);
  }
  return p;
}

/* Looks every function of the fake's control API up (no fake: SETUP, exit 3). */
void load_fake_api(void) {
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
  fv.set_lose_acks = (int (*)(int, unsigned))fake_sym("fake_verbs_set_lose_acks");
  fv.set_retry_without_end_at_7 =
      (int (*)(int, int))fake_sym("fake_verbs_set_retry_without_end_at_7");
  fv.move_gid = (int (*)(int, int, int))fake_sym("fake_verbs_move_gid");
  fv.device_count = (int (*)(void))fake_sym("fake_verbs_device_count");
  fv.reset = (void (*)(void))fake_sym("fake_verbs_reset");
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
    struct ibv_cq* cq = ibv_create_cq(s->ctx, cqe, s, s->channel, 0);
    if (!cq) setup_fail("ibv_create_cq on %s", want);
    return cq;
  }
  struct ibv_cq_init_attr_ex attr = {.cqe = (uint32_t)cqe,
                                     .cq_context = s,
                                     .channel = s->channel,
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
  if (g_events) {
    s->channel = ibv_create_comp_channel(s->ctx);
    if (!s->channel) setup_fail("ibv_create_comp_channel on %s", want);
    if (s == &g_a && fcntl(s->channel->fd, F_SETFL,
                           fcntl(s->channel->fd, F_GETFL) | O_NONBLOCK) != 0)
      setup_fail("O_NONBLOCK on A's channel");
  }
  s->cq = create_cq(s, &s->cqx, want);
  if (g_split_cq) {
    s->rcq = create_cq(s, &s->rcqx, want);
  } else {
    s->rcq = s->cq;
    s->rcqx = s->cqx;
  }
  if (g_events && (ibv_req_notify_cq(s->cq, 0) != 0 || ibv_req_notify_cq(s->rcq, 0) != 0))
    setup_fail("ibv_req_notify_cq on %s", want);
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

/* --rts-modify: RTS -> RTS with one attribute, the way an application tunes a live QP. */
static void modify_rts_to_rts(struct side* s) {
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_RTS;
  attr.min_rnr_timer = 14;
  if (ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) != 0)
    setup_fail("%s: ibv_modify_qp RTS -> RTS (min_rnr_timer) failed: %s", s->name, strerror(errno));
}

void setup(int recvs_a, int recvs_b) {
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
  if (g_rts_modify) {
    modify_rts_to_rts(&g_a);
    modify_rts_to_rts(&g_b);
  }
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

static void destroy_hung(int sig) {
  (void)sig;
  static const char msg[] = "FAIL: ibv_destroy_cq of a CQ a QP still uses, with an event not yet "
                            "acknowledged, hung (libibverbs gives EBUSY at once)\n";
  if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
  _exit(1);
}

/* --events, after the checks: a CQ a QP still uses is EBUSY at once, even with an event of it
   held unacknowledged (libibverbs waits for the acks only once the destroy went through); a
   channel with a CQ alive is EBUSY; once its QP and CQs are gone it is destroyed (the struct's
   refcnt counted the CQs, whoever made them). */
void teardown_events(void) {
  struct side* sides[2] = {&g_a, &g_b};
  for (int i = 0; i < 2; ++i) {  /* both QPs alive: each side's write needs its peer */
    struct side* s = sides[i];
    struct ibv_cq* held = hold_one_event(s);
    if (held == NULL) continue;
    signal(SIGALRM, destroy_hung);
    alarm((unsigned)(g_timeout_ms / 1000 + 1));
    const int busy_cq = ibv_destroy_cq(held);
    alarm(0);
    if (busy_cq != EBUSY) fail("%s: destroying a CQ its QP uses gave %d, not EBUSY", s->name, busy_cq);
    ibv_ack_cq_events(held, 1);
  }
  for (int i = 0; i < 2; ++i) {
    struct side* s = sides[i];
    const int busy = ibv_destroy_comp_channel(s->channel);
    if (busy != EBUSY) fail("%s: destroying the channel of a live CQ gave %d, not EBUSY", s->name, busy);
    if (ibv_destroy_qp(s->qp) != 0) fail("%s: ibv_destroy_qp: %s", s->name, strerror(errno));
    if (s->rcq != s->cq && ibv_destroy_cq(s->rcq) != 0) fail("%s: ibv_destroy_cq (receives)", s->name);
    if (ibv_destroy_cq(s->cq) != 0) fail("%s: ibv_destroy_cq", s->name);
    const int rc = ibv_destroy_comp_channel(s->channel);
    if (rc != 0) fail("%s: ibv_destroy_comp_channel: %s", s->name, strerror(rc));
  }
}
