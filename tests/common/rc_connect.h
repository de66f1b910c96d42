/* Brings an RC QP from RESET to RTS towards a peer QP, the way every test program and benchmark
   of the project does it (RoCE: global route by GID, port 1, MTU 1024, PSNs 0, infinite RNR
   retries). Returns 0, or the step that failed: 1 INIT, 2 RTR, 3 RTS (errno from the verb).
   The steps are also available one by one (a test that acts between RTR and RTS). */
#pragma once

#include <infiniband/verbs.h>
#include <string.h>

static inline int vf_test_rc_to_init(struct ibv_qp* qp, unsigned int access) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static inline int vf_test_rc_to_rtr(struct ibv_qp* qp, uint32_t dest_qpn, union ibv_gid dgid,
                                    int sgid_index) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static inline int vf_test_rc_to_rts(struct ibv_qp* qp) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static inline int vf_test_rc_connect(struct ibv_qp* qp, uint32_t dest_qpn, union ibv_gid dgid,
                                     int sgid_index, unsigned int access) {
  if (vf_test_rc_to_init(qp, access)) return 1;
  if (vf_test_rc_to_rtr(qp, dest_qpn, dgid, sgid_index)) return 2;
  if (vf_test_rc_to_rts(qp)) return 3;
  return 0;
}
