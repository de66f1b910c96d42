/* Internal to vf_exactly_once: what its files share. The buffer layout, the model of the test
   (struct side and the expectations it records), the options, and the functions one file
   offers the others, grouped by the file that owns them:
     exactly_once.c           the program: what it checks, options, main
     exactly_once_check.c     the checker: expectations, completion checks, final checks, fail()
     exactly_once_fabric.c    the fake's control API and the setup of devices, MRs, CQs, QPs
     exactly_once_traffic.c   posting, receives, the --srq stream, polling and bounded waits
     exactly_once_cuts.c      the cut points (scenario_* functions) and the scenario table
     exactly_once_recovery.c  scenarios after the failover: failback, standby blink, repair
     exactly_once_selftest.c  the checker fed duplicated, lost, reordered completions */
#pragma once

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

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
#define POISON_SEED 0x9015u   /* --rereg: the first buffer's pattern (+ device index) */
#define CQ_EX_BATCH 3         /* --cq-ex: completions per start_poll..end_poll cycle, at most */
#define ECE_OPTIONS 0x1u      /* --ece: what the application sets on its QPs */
#define STREAM_WARMUP 2       /* --srq: second-pair messages each way in warmup() */
#define CLOBBER 0xee          /* what the application writes over an inline WR's buffer */

/* ------------------------------------------------------------------ fake control API */

struct fake_control {
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
  int (*set_lose_acks)(int, unsigned);
  int (*set_retry_without_end_at_7)(int, int);
  int (*move_gid)(int, int, int);
  int (*device_count)(void);
  void (*reset)(void);
};
extern struct fake_control fv; /* filled by load_fake_api() (exactly_once_fabric.c) */

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
  /* --events: the completion channel of cq and rcq (A's fd is O_NONBLOCK, drained until EAGAIN,
     as rsockets does; B's blocks, one event per wake-up), and how many CQ events it gave */
  struct ibv_comp_channel* channel;
  int cq_events;
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

/* ------------------------------------------------------------------ options (exactly_once.c) */

extern int g_timeout_ms;
extern int g_wr_api;
extern int g_sig_all;
extern int g_split_cq;
extern int g_srq;
extern int g_cq_ex;
extern int g_rereg;
extern int g_resize_cq;
extern int g_ece;
extern int g_rts_modify;
extern int g_rxe_flush;
extern int g_silent_cut;
extern int g_gid_changed_on; /* the device whose GID table a scenario changed, -1 if none */
extern int g_rxe_retry;
extern int g_events;

/* ------------------------------------------------------------------ exactly_once_check.c */

extern int g_failures;
extern int g_quiet;
extern const char* g_scenario;
extern struct side g_a, g_b, g_a2, g_b2;
extern struct exp_mem g_mem[MAX_EXP];
extern uint32_t g_n_mem;

void fail(const char* fmt, ...);
void setup_fail(const char* fmt, ...);
long long now_ms(void);
void fill_pattern(uint8_t* p, uint32_t len, uint32_t seed);
const char* wc_desc(const struct ibv_wc* wc);
void on_wc(struct side* s, const struct ibv_wc* wc);
void take_over(struct side* s, uint32_t first_mem, uint32_t end_mem);
void check_memory(void);
void check_srq_final(struct side* h);
void check_qp_and_events(struct side* s);
void check_poison(const struct side* s);
void check_ece(void);

/* ------------------------------------------------------------------ exactly_once_fabric.c */

void load_fake_api(void);
void setup(int recvs_a, int recvs_b);
void teardown_events(void);

/* ------------------------------------------------------------------ exactly_once_traffic.c */

/* ZSGE: a zero-length request carries one SGE of length 0 whose lkey names nothing (providers
   skip such SGEs: mlx5 and rxe never look at its lkey). */
enum { SIG = 1, INL = 2, ZSGE = 4 };
enum { POLL_A = 1, POLL_B = 2, POLL_BOTH = 3 };

extern long g_cq_ex_cycles, g_cq_ex_left_early;

uint64_t post_op(struct side* s, enum ibv_wr_opcode op, uint32_t len, int flags, uint32_t imm);
void begin_batch(struct side* s);
void end_batch(struct side* s);
void post_recvs(struct side* s, int count);
void stream_msg(struct side* s);
void stream(int rounds);
int recvs_left(const struct side* s);
struct side* qp_owner(struct side* s, const struct ibv_wc* wc);
int poll_side(struct side* s);
struct ibv_cq* hold_one_event(struct side* s);
int all_done(void);
int wait_for(int (*cond)(void), int which, const char* what);
int b_got_all_msgs(void);
int a_got_all_sends(void);
struct fake_verbs_qp_stats qp_stats(struct side* s);
void warmup(void);
void after_round(void);
void quiet_window(void);

/* ------------------------------------------------------------------ scenarios */

struct scenario {
  const char* name;
  void (*run)(void);
};

/* exactly_once_cuts.c: the scenario called `name`, or NULL. */
const struct scenario* find_scenario(const char* name);
void do_cut(void);

/* exactly_once_recovery.c */
void scenario_failback_in_flight(void);
void scenario_failback_gid_moved(void);
void scenario_standby_blink(void);
void scenario_silent_cut_repaired(void);
void scenario_standby_silent(void);

/* ------------------------------------------------------------------ exactly_once_selftest.c */

int selftest(void);
