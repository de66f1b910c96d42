/* The cut points of vf_exactly_once: a scenario_* function each (setup, warm-up, the traffic
   around the cut, the cut point verified with the fake's counters before do_cut()), and the
   table of every scenario by name, those of exactly_once_recovery.c included. A new cut point is
   a function here and a row in kScenarios. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/failover/exactly_once.h"

#define LATE_RECV_CQE_STEPS 2000 /* late_recv_cqe: B's receive completions lag this many steps */
#define BIG_DELAY 1000000u /* progress steps: "held on the wire until the port dies" */

static void hold_fake0(void) { fv.set_delay(0, BIG_DELAY); }

/* --srq: the second pair's stream goes on around the cut: one message each way right before
   the port dies (held on the wire with the scenario's traffic when fake0 is delayed, else
   delivered with its completions unpolled, or in RNR when B's SRQ is empty), one right after
   (racing the detection). The scenario's cut point was verified before. */
void do_cut(void) {
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

/* ------------------------------------------------------------------ the scenarios by name */

/* A's SEND was executed by B (its data placed, B's receive completed) but its acknowledgement is
   lost, and so is every retry's until the port dies (the fake's lose_acks): A has no completion
   for it, and the WRITE_WITH_IMM behind it was never sent. A must get each completion once,
   SUCCESS (B's count proves the SEND delivered), and B each message once: the SEND is not sent
   again, the WRITE_WITH_IMM is. */
#define LOST_ACKS 1000u /* more than any retry count: every retry's acknowledgement is lost */
static void scenario_ack_lost(void) {
  setup(48, 48);
  warmup();
  const struct fake_verbs_qp_stats a0 = qp_stats(&g_a), b0 = qp_stats(&g_b);
  if (fv.set_lose_acks(0, LOST_ACKS) != 0) setup_fail("fake_verbs_set_lose_acks(0)");
  begin_batch(&g_a);
  post_op(&g_a, IBV_WR_SEND, 300, SIG, 0);
  post_op(&g_a, IBV_WR_RDMA_WRITE_WITH_IMM, 400, SIG, 0xacc0);
  end_batch(&g_a);
  const struct fake_verbs_qp_stats a1 = qp_stats(&g_a), b1 = qp_stats(&g_b);
  if (a1.messages_sent != a0.messages_sent + 1 || b1.messages_received != b0.messages_received + 1)
    setup_fail("the SEND was not executed alone with its acknowledgement lost (A sent %llu->%llu, "
               "B received %llu->%llu)",
               (unsigned long long)a0.messages_sent, (unsigned long long)a1.messages_sent,
               (unsigned long long)b0.messages_received, (unsigned long long)b1.messages_received);
  do_cut();
  if (fv.set_lose_acks(0, 0) != 0) setup_fail("fake_verbs_set_lose_acks(0, 0)");
  wait_for(all_done, POLL_BOTH, "the SEND whose acknowledgement was lost, and the request behind it");
}

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
    {"failback_gid_moved", scenario_failback_gid_moved},
    {"standby_blink", scenario_standby_blink},
    {"standby_silent", scenario_standby_silent},
    {"no_cut", scenario_no_cut},
    {"ack_lost", scenario_ack_lost},
};

const struct scenario* find_scenario(const char* name) {
  const struct scenario* sc = NULL;
  for (size_t i = 0; i < sizeof kScenarios / sizeof kScenarios[0]; ++i)
    if (strcmp(kScenarios[i].name, name) == 0) sc = &kScenarios[i];
  return sc;
}
