// The shim's replacements for the function pointers providers publish. Each lives in the file of
// its verb family; object_records.cc installs them.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace vf::shim::ops {

// ibv_context.ops (reached through the static inline ibv_post_send, ibv_poll_cq...)
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);

// verbs_context (reached through verbs_get_ctx_op in ibv_query_port, ibv_create_qp_ex...)
int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len);
int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr, size_t attr_size);
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr);
ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr);

// ibv_qp_ex and ibv_cq_ex function tables.
void install_qp_ex_hooks(ibv_qp_ex* qpx, uint64_t send_ops_flags);
void install_cq_ex_hooks(ibv_cq_ex* cq);
// The completion fields an ibv_wc carries: an extended CQ asking for no other is managed by the
// failover engine, and its iterator reads them from the completions polled through it.
inline constexpr std::uint64_t kFailoverCqExFields =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
    IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS;
void install_cq_ex_readers(ibv_cq_ex* cq);
// After the failover engine took an extended QP: its wr_* batches also go to the ring.
void install_protected_wr_hooks(ibv_qp_ex* qpx);
// The ibv_wr_* operations a protected QP may declare (a QP that declares others is unprotected).
inline constexpr uint64_t kProtectedSendOps =
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
    // Not replayable: a QP that declares them is protected until it posts one, and then runs
    // pass-through (issue 19 item 8, docs/design.md §5h); with an SRQ, unprotected from the start.
    IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV |
    IBV_QP_EX_WITH_ATOMIC_WRITE;
inline constexpr uint64_t kUnreplayableSendOps = IBV_QP_EX_WITH_LOCAL_INV |
                                                 IBV_QP_EX_WITH_BIND_MW |
                                                 IBV_QP_EX_WITH_SEND_WITH_INV |
                                                 IBV_QP_EX_WITH_ATOMIC_WRITE;

}  // namespace vf::shim::ops
