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

   --rts-modify: once connected, every QP is modified RTS -> RTS with a new min_rnr_timer alone
   (IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER), as an application tuning a live connection does. A shim
   that kept only that modify's attributes for re-connecting the primary (its RTS needs the send
   PSN, timeout and retry counts) could not re-arm it: no failback.

   Usage: exactly_once SCENARIO [--wr-api] [--sig-all] [--split-cq] [--srq] [--cq-ex] [--rereg]
                                [--resize-cq] [--ece] [--rxe-flush] [--rts-modify]
                                [--timeout-ms N]
          exactly_once selftest      (feeds duplicates/losses/reorders to the checker itself)
   Scenarios: see the table at the end of exactly_once_cuts.c (a new cut point is a scenario_*
   function there and a row in that table). Output: "PASS ..." and exit 0; "FAIL: ..." lines
   and exit 1; "SETUP: ..." and exit 3 when the cut point could not be established (then the run
   proves nothing either way). Waits are bounded polling loops (each poll is one progress step of
   the fake); nothing sleeps.

   This file: the options and main. The checker, the fabric's setup, the traffic, the scenarios
   and the selftest are in the exactly_once_*.c beside it (exactly_once.h lists what each owns). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/failover/exactly_once.h"

/* ------------------------------------------------------------------ options */

int g_timeout_ms = 10000; /* --timeout-ms: every wait's bound */
int g_wr_api = 0;         /* --wr-api: QPs from ibv_create_qp_ex, posts through ibv_wr_* */
int g_sig_all = 0;        /* --sig-all: QPs with sq_sig_all, every WR completes */
int g_split_cq = 0;       /* --split-cq: separate send and receive CQs */
int g_srq = 0;            /* --srq: SRQs and a second QP pair on them */
int g_cq_ex = 0;          /* --cq-ex: CQs from ibv_create_cq_ex, polled with the iterator */
int g_rereg = 0;          /* --rereg: MRs moved to a second buffer (ibv_rereg_mr) before traffic */
int g_resize_cq = 0;      /* --resize-cq: CQs created small, ibv_resize_cq'd before traffic */
int g_ece = 0;            /* --ece: every QP set to ECE_OPTIONS before RTR */
int g_rxe_flush = 0;      /* --rxe-flush: every device flushes an ERR QP's new receives late */
int g_gid_changed_on = -1; /* the device whose GID table the scenario changed (-1: none) */
int g_silent_cut = 0;     /* --silent-cut: the cut drops fake0's packets, no port event */
int g_rxe_retry = 0;      /* --rxe-retry: retry_cnt 7 retries without end on every device */
int g_rts_modify = 0;     /* --rts-modify: an RTS -> RTS modify of min_rnr_timer once connected */
int g_events = 0;         /* --events: completions are looked for only when a channel's fd wakes */

/* ------------------------------------------------------------------ main */

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s SCENARIO|selftest [--wr-api] [--sig-all] [--split-cq] [--srq] [--cq-ex] "
            "[--rereg] [--resize-cq] [--ece] [--rxe-flush] [--rts-modify] [--events] [--timeout-ms N]\n",
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
    else if (strcmp(argv[i], "--rts-modify") == 0)
      g_rts_modify = 1;
    else if (strcmp(argv[i], "--events") == 0)
      g_events = 1;
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
  if (g_events && g_srq) {
    fprintf(stderr, "--events gives A and B a channel each: not the second pair of --srq\n");
    return 2;
  }
  if (g_ece && g_srq) {
    /* the shim's SRQ sweep uses QPs of its own on the backup devices: not the application's */
    fprintf(stderr, "--ece checks every QP on the fabric: not with --srq\n");
    return 2;
  }
  const struct scenario* sc = find_scenario(argv[1]);
  if (!sc) {
    fprintf(stderr, "unknown scenario %s\n", argv[1]);
    return 2;
  }
  load_fake_api();

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
  if (g_events) {
    printf("events: A's channel gave %d CQ event(s), B's %d\n", g_a.cq_events, g_b.cq_events);
    if (g_a.cq_events == 0 || g_b.cq_events == 0) fail("a channel never gave an event");
    teardown_events();
  }
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
           g_resize_cq ? " (CQs resized)" : "", g_failures);
    if (g_events) printf("(--events: completions were looked for only when a channel woke)\n");  /* --ece: see the "ece:" lines */
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
