#include "shim/object_records.h"

#include <cstddef>
#include <new>

#include "core/log.h"
#include "shim/real_verbs.h"
#include "shim/shim_state.h"
#include "shim/verbs_hooks/ops_hooks.h"

namespace vf::shim {
namespace {

// verbs_context grows towards lower addresses; a field exists only if the provider's sz covers it.
bool has_field(const verbs_context* vctx, std::size_t offset_of_field) {
  return vctx->sz >= sizeof(verbs_context) - offset_of_field;
}

#define VF_VCTX_FIELD(vctx, field) \
  (has_field(vctx, offsetof(verbs_context, field)) ? vctx->field : nullptr)

// Patches one verbs_context entry if the provider filled it.
#define VF_PATCH_VCTX(vctx, record, field)                                          \
  do {                                                                              \
    record->field = VF_VCTX_FIELD(vctx, field);                                     \
    if (record->field != nullptr) vctx->field = ops::field;                         \
  } while (0)

void warn_full_once(std::atomic<bool>& warned, const char* what) {
  if (!warned.exchange(true)) {
    VF_LOG_WARN("more live {} than the shim tracks; the excess runs without the shim", what);
  }
}

void fork_prepare() {
  lifecycle_mutex().lock();
  context_records().lock_for_fork();
  qp_ex_records().lock_for_fork();
  cq_ex_records().lock_for_fork();
}

void fork_release() {
  cq_ex_records().unlock_after_fork();
  qp_ex_records().unlock_after_fork();
  context_records().unlock_after_fork();
  lifecycle_mutex().unlock();
}

}  // namespace

ContextRegistry& context_records() {
  static ContextRegistry registry;
  return registry;
}
QpExRegistry& qp_ex_records() {
  static QpExRegistry registry;
  return registry;
}
CqExRegistry& cq_ex_records() {
  static CqExRegistry registry;
  return registry;
}
std::mutex& lifecycle_mutex() {
  static std::mutex mutex;
  return mutex;
}

void register_records_for_fork() {
  register_fork_participant({fork_prepare, fork_release, fork_release});
}

void manage_context(ibv_context* context) {
  if (context_records().find(context) != nullptr) return;  // patched already
  // Allocation failure leaves the object unmanaged (provider functions), never an exception
  // escaping into C callers.
  auto* record = new (std::nothrow) ContextRecord;
  if (record == nullptr) return;
  record->context = context;
  record->ops = context->ops;
  if (!context_records().insert(context, record)) {
    delete record;
    static std::atomic<bool> warned{false};
    warn_full_once(warned, "device contexts");
    return;
  }
  // From here on the inline data-path verbs of this context enter the shim.
  context->ops.post_send = ops::post_send;
  context->ops.post_recv = ops::post_recv;
  context->ops.poll_cq = ops::poll_cq;
  context->ops.req_notify_cq = ops::req_notify_cq;
  if (record->ops.post_srq_recv != nullptr) context->ops.post_srq_recv = ops::post_srq_recv;
  if (verbs_context* vctx = verbs_get_ctx(context)) {
    VF_PATCH_VCTX(vctx, record, query_port);
    VF_PATCH_VCTX(vctx, record, query_device_ex);
    VF_PATCH_VCTX(vctx, record, create_qp_ex);
    VF_PATCH_VCTX(vctx, record, create_cq_ex);
    VF_PATCH_VCTX(vctx, record, create_srq_ex);
  }
}

void forget_context(ibv_context* context) { delete context_records().erase(context); }

void manage_qp_ex(ibv_qp* qp, uint64_t send_ops_flags) {
  const auto to_qp_ex = real_verbs().ibv_qp_to_qp_ex;
  ibv_qp_ex* qpx = to_qp_ex != nullptr ? to_qp_ex(qp) : nullptr;
  if (qpx == nullptr || qpx->wr_start == nullptr) return;  // no ibv_wr_* API on this QP
  if (static_cast<void*>(qpx) != static_cast<void*>(qp)) return;  // forget_qp_ex relies on it
  if (qp_ex_records().find(qpx) != nullptr) return;        // patched already
  auto* record = new (std::nothrow) QpExRecord;
  if (record == nullptr) return;
  record->original = *qpx;
  if (!qp_ex_records().insert(qpx, record)) {
    delete record;
    static std::atomic<bool> warned{false};
    warn_full_once(warned, "extended QPs");
    return;
  }
  ops::install_qp_ex_hooks(qpx, send_ops_flags);
}

void forget_qp_ex(ibv_qp* qp) { delete qp_ex_records().erase(qp); }

void manage_cq_ex(ibv_cq_ex* cq) {
  if (cq->start_poll == nullptr || cq_ex_records().find(cq) != nullptr) return;
  auto* record = new (std::nothrow) CqExRecord;
  if (record == nullptr) return;
  record->original = *cq;
  if (!cq_ex_records().insert(cq, record)) {
    delete record;
    static std::atomic<bool> warned{false};
    warn_full_once(warned, "extended CQs");
    return;
  }
  ops::install_cq_ex_hooks(cq);
}

// ibv_cq_ex begins with the fields of ibv_cq (ibv_cq_ex_to_cq is a cast), so the address of an
// extended CQ and of its ibv_cq view are the same key.
void forget_cq(ibv_cq* cq) { delete cq_ex_records().erase(cq); }

}  // namespace vf::shim
