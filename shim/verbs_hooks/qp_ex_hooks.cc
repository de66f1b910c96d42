// The ibv_wr_* send API of extended QPs (perftest and librdmacm use it by default on real NICs).
// Each provider function pointer in ibv_qp_ex is replaced by a hook that finds the QP's record and
// calls the provider's original.
#include <infiniband/verbs.h>

#include <algorithm>
#include <type_traits>

#include "shim/object_records.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"

namespace vf::shim::ops {
namespace {

template <std::size_t N>
struct VerbName {
  char text[N];
  constexpr VerbName(const char (&name)[N]) { std::copy_n(name, N, text); }
};

template <typename MemberPointer>
struct WrHook;

template <typename R, typename... Args>
struct WrHook<R (*ibv_qp_ex::*)(ibv_qp_ex*, Args...)> {
  template <VerbName kName, R (*ibv_qp_ex::*kMember)(ibv_qp_ex*, Args...)>
  static R call(ibv_qp_ex* qpx, Args... args) {
    const QpExRecord* record = qp_ex_records().find(qpx);
    if (__builtin_expect(record == nullptr, 0)) {
      if constexpr (std::is_void_v<R>) {
        return;
      } else {
        return EINVAL;
      }
    }
    const auto original = record->original.*kMember;
    if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) return original(qpx, args...);
    if constexpr (std::is_void_v<R>) {
      original(qpx, args...);
      log(LogLevel::kTrace, "{}({} wr_id={:#x} wr_flags={:#x})", kName.text,
          describe_qp(&qpx->qp_base), qpx->wr_id, qpx->wr_flags);
    } else {
      const R result = original(qpx, args...);
      log(LogLevel::kTrace, "{}({}) = {}", kName.text, describe_qp(&qpx->qp_base), result);
      return result;
    }
  }

  template <VerbName kName, R (*ibv_qp_ex::*kMember)(ibv_qp_ex*, Args...)>
  static void install(ibv_qp_ex* qpx) {
    if (qpx->*kMember != nullptr) qpx->*kMember = &call<kName, kMember>;
  }
};

#define VF_INSTALL_WR_HOOK(qpx, field) \
  WrHook<decltype(&ibv_qp_ex::field)>::install<"ibv_" #field, &ibv_qp_ex::field>(qpx)

}  // namespace

void install_qp_ex_hooks(ibv_qp_ex* qpx, uint64_t send_ops_flags) {
  VF_INSTALL_WR_HOOK(qpx, wr_start);
  VF_INSTALL_WR_HOOK(qpx, wr_complete);
  VF_INSTALL_WR_HOOK(qpx, wr_abort);
  VF_INSTALL_WR_HOOK(qpx, wr_send);
  VF_INSTALL_WR_HOOK(qpx, wr_send_imm);
  VF_INSTALL_WR_HOOK(qpx, wr_send_inv);
  VF_INSTALL_WR_HOOK(qpx, wr_send_tso);
  VF_INSTALL_WR_HOOK(qpx, wr_rdma_write);
  VF_INSTALL_WR_HOOK(qpx, wr_rdma_write_imm);
  VF_INSTALL_WR_HOOK(qpx, wr_rdma_read);
  VF_INSTALL_WR_HOOK(qpx, wr_atomic_cmp_swp);
  VF_INSTALL_WR_HOOK(qpx, wr_atomic_fetch_add);
  // Added to ibv_qp_ex in rdma-core v44: on an older runtime this address is the provider's
  // verbs_qp.comp_mask. A provider that accepted IBV_QP_EX_WITH_ATOMIC_WRITE has the member.
  if (send_ops_flags & IBV_QP_EX_WITH_ATOMIC_WRITE) VF_INSTALL_WR_HOOK(qpx, wr_atomic_write);
  VF_INSTALL_WR_HOOK(qpx, wr_bind_mw);
  VF_INSTALL_WR_HOOK(qpx, wr_local_inv);
  VF_INSTALL_WR_HOOK(qpx, wr_set_sge);
  VF_INSTALL_WR_HOOK(qpx, wr_set_sge_list);
  VF_INSTALL_WR_HOOK(qpx, wr_set_inline_data);
  VF_INSTALL_WR_HOOK(qpx, wr_set_inline_data_list);
  VF_INSTALL_WR_HOOK(qpx, wr_set_ud_addr);
  VF_INSTALL_WR_HOOK(qpx, wr_set_xrc_srqn);
}

}  // namespace vf::shim::ops
