// The ibv_wr_* send API of extended QPs (perftest and librdmacm use it by default on real NICs).
// Each provider function pointer in ibv_qp_ex is replaced by a hook that finds the QP's record and
// calls the provider's original.
#include <infiniband/verbs.h>

#include <algorithm>
#include <type_traits>

#include "core/failover_engine.h"
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

// A protected QP's batch is also staged in its VirtualQp (so it lands in the retransmit ring);
// on the standby path it is only staged, and posted from the ring by wr_complete.
#define VF_TRACE_WR(name)                                                                \
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0)) {                              \
    log(LogLevel::kTrace, "ibv_" name "({} wr_id={:#x} wr_flags={:#x}) [protected]",     \
        describe_qp(&qpx->qp_base), qpx->wr_id, qpx->wr_flags);                          \
  }

VirtualQp* virtual_qp_of(ibv_qp_ex* qpx) {
  return FailoverEngine::instance().virtual_qp(&qpx->qp_base);
}

void protected_wr_start(ibv_qp_ex* qpx) {
  VF_TRACE_WR("wr_start");
  const QpExRecord* record = qp_ex_records().find(qpx);
  VirtualQp* v = virtual_qp_of(qpx);
  if (record == nullptr) return;
  if (v == nullptr) return record->original.wr_start(qpx);
  v->wr_start();
  if (v->wr_direct()) record->original.wr_start(qpx);
}

int protected_wr_complete(ibv_qp_ex* qpx) {
  VF_TRACE_WR("wr_complete");
  const QpExRecord* record = qp_ex_records().find(qpx);
  VirtualQp* v = virtual_qp_of(qpx);
  if (record == nullptr) return EINVAL;
  if (v == nullptr) return record->original.wr_complete(qpx);
  if (!v->wr_direct()) return v->wr_complete_routed();
  const int state = v->wr_begin_complete();
  if (state == VirtualQp::kWrRerouted) {
    // A switch began during the batch: the provider's half goes nowhere, the staged one is
    // posted from the ring on the new path.
    record->original.wr_abort(qpx);
    return v->wr_complete_routed_locked();
  }
  if (state != 0) {
    record->original.wr_abort(qpx);
    return state;
  }
  const int result = record->original.wr_complete(qpx);
  v->wr_finish(result);
  return result;
}

void protected_wr_abort(ibv_qp_ex* qpx) {
  VF_TRACE_WR("wr_abort");
  const QpExRecord* record = qp_ex_records().find(qpx);
  VirtualQp* v = virtual_qp_of(qpx);
  if (record == nullptr) return;
  if (v == nullptr) return record->original.wr_abort(qpx);
  if (v->wr_direct()) record->original.wr_abort(qpx);
  v->wr_abort();
}

// One opcode setter: stage (opcode, the caller's wr_id and flags, fill) then, in direct mode,
// the provider's own setter.
#define VF_PROTECTED_OPCODE(name, opcode, params, args, fill)                           \
  void protected_##name params {                                                        \
    VF_TRACE_WR(#name);                                                                 \
    const QpExRecord* record = qp_ex_records().find(qpx);                               \
    if (record == nullptr) return;                                                      \
    VirtualQp* v = virtual_qp_of(qpx);                                                  \
    if (v != nullptr) {                                                                 \
      if (ibv_send_wr* wr = v->wr_stage(opcode, qpx->wr_id, qpx->wr_flags)) { fill; }   \
      if (!v->wr_direct()) return;                                                      \
    }                                                                                   \
    record->original.name args;                                                         \
  }

VF_PROTECTED_OPCODE(wr_send, IBV_WR_SEND, (ibv_qp_ex * qpx), (qpx), (void)wr)
VF_PROTECTED_OPCODE(wr_send_imm, IBV_WR_SEND_WITH_IMM, (ibv_qp_ex * qpx, __be32 imm),
                    (qpx, imm), wr->imm_data = imm)
VF_PROTECTED_OPCODE(wr_rdma_write, IBV_WR_RDMA_WRITE,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr), (qpx, rkey, addr),
                    (wr->wr.rdma.rkey = rkey, wr->wr.rdma.remote_addr = addr))
VF_PROTECTED_OPCODE(wr_rdma_write_imm, IBV_WR_RDMA_WRITE_WITH_IMM,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr, __be32 imm),
                    (qpx, rkey, addr, imm),
                    (wr->wr.rdma.rkey = rkey, wr->wr.rdma.remote_addr = addr, wr->imm_data = imm))
VF_PROTECTED_OPCODE(wr_rdma_read, IBV_WR_RDMA_READ,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr), (qpx, rkey, addr),
                    (wr->wr.rdma.rkey = rkey, wr->wr.rdma.remote_addr = addr))
VF_PROTECTED_OPCODE(wr_atomic_cmp_swp, IBV_WR_ATOMIC_CMP_AND_SWP,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr, uint64_t compare,
                     uint64_t swap),
                    (qpx, rkey, addr, compare, swap),
                    (wr->wr.atomic.rkey = rkey, wr->wr.atomic.remote_addr = addr,
                     wr->wr.atomic.compare_add = compare, wr->wr.atomic.swap = swap))
VF_PROTECTED_OPCODE(wr_atomic_fetch_add, IBV_WR_ATOMIC_FETCH_AND_ADD,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr, uint64_t add),
                    (qpx, rkey, addr, add),
                    (wr->wr.atomic.rkey = rkey, wr->wr.atomic.remote_addr = addr,
                     wr->wr.atomic.compare_add = add))

// Requests the retransmit ring cannot replay on another device (issue 19 item 8): staged like the
// others, so that wr_complete sees them; on the healthy primary the provider posts the batch and
// the QP becomes pass-through, on the standby the batch is refused (VirtualQp::wr_begin_complete,
// wr_complete_routed_locked).
VF_PROTECTED_OPCODE(wr_send_inv, IBV_WR_SEND_WITH_INV, (ibv_qp_ex * qpx, uint32_t invalidate_rkey),
                    (qpx, invalidate_rkey), wr->invalidate_rkey = invalidate_rkey)
VF_PROTECTED_OPCODE(wr_local_inv, IBV_WR_LOCAL_INV, (ibv_qp_ex * qpx, uint32_t invalidate_rkey),
                    (qpx, invalidate_rkey), wr->invalidate_rkey = invalidate_rkey)
VF_PROTECTED_OPCODE(wr_bind_mw, IBV_WR_BIND_MW,
                    (ibv_qp_ex * qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info),
                    (qpx, mw, rkey, info), (void)wr)
VF_PROTECTED_OPCODE(wr_atomic_write, IBV_WR_ATOMIC_WRITE,
                    (ibv_qp_ex * qpx, uint32_t rkey, uint64_t addr, const void* atomic_wire),
                    (qpx, rkey, addr, atomic_wire), (void)wr)

void protected_wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  VF_TRACE_WR("wr_set_sge");
  const QpExRecord* record = qp_ex_records().find(qpx);
  if (record == nullptr) return;
  if (VirtualQp* v = virtual_qp_of(qpx)) {
    const ibv_sge sge{addr, length, lkey};
    v->wr_stage_sges(1, &sge);
    if (!v->wr_direct()) return;
  }
  record->original.wr_set_sge(qpx, lkey, addr, length);
}

void protected_wr_set_sge_list(ibv_qp_ex* qpx, size_t count, const ibv_sge* sges) {
  VF_TRACE_WR("wr_set_sge_list");
  const QpExRecord* record = qp_ex_records().find(qpx);
  if (record == nullptr) return;
  if (VirtualQp* v = virtual_qp_of(qpx)) {
    v->wr_stage_sges(count, sges);
    if (!v->wr_direct()) return;
  }
  record->original.wr_set_sge_list(qpx, count, sges);
}

void protected_wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  VF_TRACE_WR("wr_set_inline_data");
  const QpExRecord* record = qp_ex_records().find(qpx);
  if (record == nullptr) return;
  if (VirtualQp* v = virtual_qp_of(qpx)) {
    const ibv_data_buf buf{addr, length};
    v->wr_stage_inline(1, &buf);
    if (!v->wr_direct()) return;
  }
  record->original.wr_set_inline_data(qpx, addr, length);
}

void protected_wr_set_inline_data_list(ibv_qp_ex* qpx, size_t count, const ibv_data_buf* bufs) {
  VF_TRACE_WR("wr_set_inline_data_list");
  const QpExRecord* record = qp_ex_records().find(qpx);
  if (record == nullptr) return;
  if (VirtualQp* v = virtual_qp_of(qpx)) {
    v->wr_stage_inline(count, bufs);
    if (!v->wr_direct()) return;
  }
  record->original.wr_set_inline_data_list(qpx, count, bufs);
}

const auto kTracedAtomicWrite =
    &WrHook<decltype(&ibv_qp_ex::wr_atomic_write)>::call<"ibv_wr_atomic_write",
                                                         &ibv_qp_ex::wr_atomic_write>;

#define VF_INSTALL_PROTECTED(qpx, field) \
  if (qpx->field != nullptr) qpx->field = protected_##field

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

// Called once the failover engine has taken the QP (its VirtualQp exists): the batch functions
// it understands stage into the ring, and so do the ones it cannot replay (the QP then becomes
// pass-through); the others (TSO, UD and XRC setters) do not apply to an RC QP.
void install_protected_wr_hooks(ibv_qp_ex* qpx) {
  if (FailoverEngine::instance().virtual_qp(&qpx->qp_base) == nullptr) return;
  if (qp_ex_records().find(qpx) == nullptr) return;  // not patched: nothing to call through
  VF_INSTALL_PROTECTED(qpx, wr_start);
  VF_INSTALL_PROTECTED(qpx, wr_complete);
  VF_INSTALL_PROTECTED(qpx, wr_abort);
  VF_INSTALL_PROTECTED(qpx, wr_send);
  VF_INSTALL_PROTECTED(qpx, wr_send_imm);
  VF_INSTALL_PROTECTED(qpx, wr_rdma_write);
  VF_INSTALL_PROTECTED(qpx, wr_rdma_write_imm);
  VF_INSTALL_PROTECTED(qpx, wr_rdma_read);
  VF_INSTALL_PROTECTED(qpx, wr_atomic_cmp_swp);
  VF_INSTALL_PROTECTED(qpx, wr_atomic_fetch_add);
  VF_INSTALL_PROTECTED(qpx, wr_send_inv);
  VF_INSTALL_PROTECTED(qpx, wr_local_inv);
  VF_INSTALL_PROTECTED(qpx, wr_bind_mw);
  // Only where install_qp_ex_hooks installed its tracing hook: on an older runtime the member is
  // not there (see there).
  if (qpx->wr_atomic_write == kTracedAtomicWrite) qpx->wr_atomic_write = protected_wr_atomic_write;
  VF_INSTALL_PROTECTED(qpx, wr_set_sge);
  VF_INSTALL_PROTECTED(qpx, wr_set_sge_list);
  VF_INSTALL_PROTECTED(qpx, wr_set_inline_data);
  VF_INSTALL_PROTECTED(qpx, wr_set_inline_data_list);
}

}  // namespace vf::shim::ops
