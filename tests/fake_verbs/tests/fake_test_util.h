// Helpers for the tests of the FAKE libibverbs. The test binary is compiled against the real
// <infiniband/verbs.h>, linked against the real libibverbs, and run with the fake on
// LD_LIBRARY_PATH; the fake's control API is therefore resolved with dlvsym at run time.
#pragma once

#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fake_verbs_control.h"

namespace fvtest {

// Function pointers into the fake, resolved once; a missing one fails the test loudly.
struct Control {
  int (*is_fake)();
  int (*device_count)();
  int (*port_down)(int);
  int (*port_up)(int);
  int (*set_drop)(int, int);
  int (*set_delay)(int, unsigned);
  void (*progress)();
  uint64_t (*progress_steps)();
  int (*query_qp_stats)(uint32_t, fake_verbs_qp_stats*);
  int (*query_device_stats)(int, fake_verbs_device_stats*);
  int (*list_qps)(int, uint32_t*, int);
  int (*set_recv_completion_delay)(int, unsigned);
  int (*set_flush_on_modify_only)(int, int);
  int (*move_gid)(int, int, int);
  void (*reset)();
};

template <class F>
inline void resolve(F*& out, const char* name) {
  out = reinterpret_cast<F*>(dlvsym(RTLD_DEFAULT, name, FAKE_VERBS_CONTROL_VERSION));
  if (out == nullptr) FAIL("fake control symbol missing: " << name);
}

inline Control& ctl() {
  static Control c = [] {
    Control k{};
    resolve(k.is_fake, "fake_verbs_is_fake");
    resolve(k.device_count, "fake_verbs_device_count");
    resolve(k.port_down, "fake_verbs_port_down");
    resolve(k.port_up, "fake_verbs_port_up");
    resolve(k.set_drop, "fake_verbs_set_drop");
    resolve(k.set_delay, "fake_verbs_set_delay");
    resolve(k.progress, "fake_verbs_progress");
    resolve(k.progress_steps, "fake_verbs_progress_steps");
    resolve(k.query_qp_stats, "fake_verbs_query_qp_stats");
    resolve(k.query_device_stats, "fake_verbs_query_device_stats");
    resolve(k.list_qps, "fake_verbs_list_qps");
    resolve(k.set_recv_completion_delay, "fake_verbs_set_recv_completion_delay");
    resolve(k.set_flush_on_modify_only, "fake_verbs_set_flush_on_modify_only");
    resolve(k.move_gid, "fake_verbs_move_gid");
    resolve(k.reset, "fake_verbs_reset");
    return k;
  }();
  return c;
}

inline fake_verbs_qp_stats qp_stats(ibv_qp* qp) {
  fake_verbs_qp_stats s{};
  REQUIRE(ctl().query_qp_stats(qp->qp_num, &s) == 0);
  return s;
}

inline ibv_context* open_device(const std::string& name) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  REQUIRE(list != nullptr);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n; ++i)
    if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  REQUIRE(ctx != nullptr);
  return ctx;
}

inline int device_index_of(const std::string& name) {
  return std::stoi(name.substr(4));
}

struct QpOptions {
  uint32_t max_send_wr = 16;
  uint32_t max_recv_wr = 16;
  uint32_t max_sge = 4;
  uint32_t max_inline = 64;
  bool sq_sig_all = false;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  int qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                  IBV_ACCESS_REMOTE_ATOMIC;
  int cq_size = 64;
  bool extended = false;     // create via ibv_create_qp_ex with SEND_OPS_FLAGS
  bool extended_cq = false;  // CQs from ibv_create_cq_ex (byte_len, imm, qp_num, src_qp)
  uint64_t send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                      IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                      IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                      IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
};

// One side of a connection: a NIC context with its own PD, CQs and one RC QP.
struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_srq* srq = nullptr;  // not owned
  ibv_qp* qp = nullptr;
  bool owns_ctx = true;

  void create(ibv_context* c, const QpOptions& o, ibv_pd* shared_pd = nullptr,
              ibv_srq* use_srq = nullptr) {
    ctx = c;
    pd = shared_pd != nullptr ? shared_pd : ibv_alloc_pd(ctx);
    REQUIRE(pd != nullptr);
    channel = ibv_create_comp_channel(ctx);
    REQUIRE(channel != nullptr);
    if (o.extended_cq) {
      ibv_cq_init_attr_ex ca{};
      ca.cqe = uint32_t(o.cq_size);
      ca.cq_context = this;
      ca.channel = channel;
      ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                    IBV_WC_EX_WITH_SRC_QP;
      ibv_cq_ex* s = ibv_create_cq_ex(ctx, &ca);
      ibv_cq_ex* r = ibv_create_cq_ex(ctx, &ca);
      REQUIRE(s != nullptr);
      REQUIRE(r != nullptr);
      send_cq = ibv_cq_ex_to_cq(s);
      recv_cq = ibv_cq_ex_to_cq(r);
    } else {
      send_cq = ibv_create_cq(ctx, o.cq_size, this, channel, 0);
      recv_cq = ibv_create_cq(ctx, o.cq_size, this, channel, 0);
    }
    REQUIRE(send_cq != nullptr);
    REQUIRE(recv_cq != nullptr);
    srq = use_srq;
    ibv_qp_init_attr_ex a{};
    a.send_cq = send_cq;
    a.recv_cq = recv_cq;
    a.srq = srq;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = o.sq_sig_all ? 1 : 0;
    a.cap.max_send_wr = o.max_send_wr;
    a.cap.max_recv_wr = o.max_recv_wr;
    a.cap.max_send_sge = o.max_sge;
    a.cap.max_recv_sge = o.max_sge;
    a.cap.max_inline_data = o.max_inline;
    a.pd = pd;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    if (o.extended) {
      a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      a.send_ops_flags = o.send_ops;
    }
    qp = ibv_create_qp_ex(ctx, &a);
    REQUIRE(qp != nullptr);
  }

  void destroy(bool destroy_pd) {
    if (qp) REQUIRE(ibv_destroy_qp(qp) == 0);
    if (send_cq) REQUIRE(ibv_destroy_cq(send_cq) == 0);
    if (recv_cq) REQUIRE(ibv_destroy_cq(recv_cq) == 0);
    if (channel) REQUIRE(ibv_destroy_comp_channel(channel) == 0);
    if (destroy_pd && pd) REQUIRE(ibv_dealloc_pd(pd) == 0);
    qp = nullptr;
  }
};

inline ibv_gid gid_of(ibv_context* ctx, int index) {
  ibv_gid g{};
  REQUIRE(ibv_query_gid(ctx, 1, index, &g) == 0);
  return g;
}

inline void to_init(ibv_qp* qp, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  REQUIRE(ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
}

inline ibv_qp_attr rtr_attr(uint32_t dest_qpn, const ibv_gid& dgid) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  return a;
}
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

inline ibv_qp_attr rts_attr(uint8_t retry_cnt, uint8_t rnr_retry) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = 14;
  a.retry_cnt = retry_cnt;
  a.rnr_retry = rnr_retry;
  a.max_rd_atomic = 1;
  return a;
}
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

inline void connect(ibv_qp* qp, int access, uint32_t dest_qpn, const ibv_gid& dgid,
                    uint8_t retry_cnt, uint8_t rnr_retry) {
  to_init(qp, access);
  ibv_qp_attr rtr = rtr_attr(dest_qpn, dgid);
  REQUIRE(ibv_modify_qp(qp, &rtr, kRtrMask) == 0);
  ibv_qp_attr rts = rts_attr(retry_cnt, rnr_retry);
  REQUIRE(ibv_modify_qp(qp, &rts, kRtsMask) == 0);
}

// Two connected RC QPs: 'a' on host A (default fake0), 'b' on host B (default fake2).
struct Pair {
  Endpoint a, b;
  explicit Pair(const QpOptions& o = QpOptions(), const std::string& dev_a = "fake0",
                const std::string& dev_b = "fake2") {
    a.create(open_device(dev_a), o);
    b.create(open_device(dev_b), o);
    connect(a.qp, o.qp_access, b.qp->qp_num, gid_of(b.ctx, 1), o.retry_cnt, o.rnr_retry);
    connect(b.qp, o.qp_access, a.qp->qp_num, gid_of(a.ctx, 1), o.retry_cnt, o.rnr_retry);
  }
  ~Pair() {
    a.destroy(true);
    b.destroy(true);
    ibv_close_device(a.ctx);
    ibv_close_device(b.ctx);
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
};

// Registered buffer.
struct Region {
  std::vector<uint8_t> buf;
  ibv_mr* mr = nullptr;
  Region(ibv_pd* pd, size_t size,
         int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC)
      : buf(size, 0) {
    mr = ibv_reg_mr(pd, buf.data(), size, access);
    REQUIRE(mr != nullptr);
  }
  ~Region() { ibv_dereg_mr(mr); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(buf.data()) + off; }
  ibv_sge sge(size_t off, uint32_t len) const { return ibv_sge{addr(off), len, mr->lkey}; }
  void fill(const std::string& s, size_t off = 0) {
    std::memcpy(buf.data() + off, s.data(), s.size());
  }
  std::string str(size_t off, size_t len) const {
    return std::string(reinterpret_cast<const char*>(buf.data()) + off, len);
  }
};

inline int post_recv(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges.data();
  wr.num_sge = int(sges.size());
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

inline int post_srq_recv(ibv_srq* srq, uint64_t wr_id, std::vector<ibv_sge> sges) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges.data();
  wr.num_sge = int(sges.size());
  ibv_recv_wr* bad = nullptr;
  return ibv_post_srq_recv(srq, &wr, &bad);
}

struct Send {
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint64_t wr_id = 0;
  std::vector<ibv_sge> sges;
  unsigned flags = IBV_SEND_SIGNALED;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;  // host order; converted to network order
  uint64_t compare_add = 0;
  uint64_t swap = 0;
};

inline int post_send(ibv_qp* qp, const Send& s) {
  ibv_send_wr wr{};
  std::vector<ibv_sge> sges = s.sges;
  wr.wr_id = s.wr_id;
  wr.opcode = s.opcode;
  wr.sg_list = sges.data();
  wr.num_sge = int(sges.size());
  wr.send_flags = s.flags;
  wr.imm_data = htonl(s.imm);
  if (s.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || s.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = s.remote_addr;
    wr.wr.atomic.rkey = s.rkey;
    wr.wr.atomic.compare_add = s.compare_add;
    wr.wr.atomic.swap = s.swap;
  } else {
    wr.wr.rdma.remote_addr = s.remote_addr;
    wr.wr.rdma.rkey = s.rkey;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// Polls until 'n' completions arrived or 'max_polls' calls were made.
inline std::vector<ibv_wc> poll(ibv_cq* cq, size_t n, int max_polls = 100) {
  std::vector<ibv_wc> out;
  for (int i = 0; i < max_polls && out.size() < n; ++i) {
    ibv_wc wc[16];
    int got = ibv_poll_cq(cq, 16, wc);
    REQUIRE(got >= 0);
    out.insert(out.end(), wc, wc + got);
  }
  return out;
}

inline ibv_wc poll_one(ibv_cq* cq) {
  auto v = poll(cq, 1);
  REQUIRE(v.size() == 1);
  return v[0];
}

inline ibv_qp_state state_of(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr i{};
  REQUIRE(ibv_query_qp(qp, &a, IBV_QP_STATE, &i) == 0);
  return a.qp_state;
}

// Every test starts from a clean fabric: no faults, zero counters.
struct Clean {
  Clean() { ctl().reset(); }
};

}  // namespace fvtest
