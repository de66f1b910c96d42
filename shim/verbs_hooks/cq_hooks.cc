// Completion queues: creation (classic and extended), destruction, and the polling functions.
#include <infiniband/verbs.h>

#include <mutex>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/object_records.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

namespace {

std::string describe_cq(const ibv_cq* cq) {
  if (cq == nullptr) return "cq=NULL";
  return fmt::format("cq={}(cqe={})", fmt::ptr(cq), cq->cqe);
}

void trace_poll_line(const char* verb, const ibv_cq* cq, int num_entries, const ibv_wc* wc,
                     int polled, std::uint64_t elapsed_ns, int error);

// A busy-polling program (NCCL) polls an empty CQ millions of times a second; one trace line per
// empty poll would drown the log, so they are counted and reported on the next non-empty poll.
thread_local std::uint64_t t_empty_polls = 0;

void trace_poll(const char* verb, const ibv_cq* cq, int num_entries, const ibv_wc* wc, int polled,
                std::uint64_t elapsed_ns) {
  const int saved_errno = errno;  // a failed poll's errno is the caller's to read
  trace_poll_line(verb, cq, num_entries, wc, polled, elapsed_ns, saved_errno);
  errno = saved_errno;
}

void trace_poll_line(const char* verb, const ibv_cq* cq, int num_entries, const ibv_wc* wc,
                     int polled, std::uint64_t elapsed_ns, int error) {
  if (polled == 0) {
    ++t_empty_polls;
    return;
  }
  vf::shim::TraceBuffer args;
  fmt::format_to(std::back_inserter(args), "{} n={} after_empty_polls={}", describe_cq(cq),
                 num_entries, t_empty_polls);
  t_empty_polls = 0;
  vf::shim::TraceBuffer result;
  fmt::format_to(std::back_inserter(result), "{} [{}]", polled,
                 polled > 0 ? vf::shim::describe_wc(wc, polled) : std::string());
  vf::shim::emit_trace(verb, args, &result, polled < 0 ? error : 0, elapsed_ns);
}

}  // namespace

VF_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                ibv_comp_channel* channel, int comp_vector) {
  return intercept("ibv_create_cq",
                   VF_ARGS("{} cqe={} cq_context={} channel={} vector={}",
                           describe_context(context), cqe, cq_context, fmt::ptr(channel),
                           comp_vector),
                   [&] {
                     ibv_cq* cq = real_verbs().ibv_create_cq(context, cqe, cq_context, channel,
                                                             comp_vector);
                     if (cq != nullptr && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_cq_created(cq, channel);
                     }
                     return cq;
                   });
}

VF_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  return intercept("ibv_resize_cq", VF_ARGS("{} new_cqe={}", describe_cq(cq), cqe),
                   [&] { return real_verbs().ibv_resize_cq(cq, cqe); });
}

VF_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  return intercept("ibv_destroy_cq", VF_ARGS("{}", describe_cq(cq)), [&] {
    if (!vf::shim::shim_active()) return real_verbs().ibv_destroy_cq(cq);
    vf::FailoverEngine::instance().on_cq_destroy(cq);
    std::lock_guard lock(vf::shim::lifecycle_mutex());
    const int result = real_verbs().ibv_destroy_cq(cq);
    if (result == 0) vf::shim::forget_cq(cq);
    return result;
  });
}

namespace vf::shim::ops {

int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  if (CqState* state = FailoverEngine::instance().cq_state(cq)) {
    if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) return state->poll(num_entries, wc);
    const std::uint64_t start = monotonic_ns();
    const int polled = state->poll(num_entries, wc);
    trace_poll("ibv_poll_cq", cq, num_entries, wc, polled, monotonic_ns() - start);
    return polled;
  }
  const ContextRecord* record = context_records().find(cq->context);
  if (__builtin_expect(record == nullptr, 0)) return -1;
  if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) {
    return record->ops.poll_cq(cq, num_entries, wc);
  }
  const std::uint64_t start = monotonic_ns();
  const int polled = record->ops.poll_cq(cq, num_entries, wc);
  trace_poll("ibv_poll_cq", cq, num_entries, wc, polled, monotonic_ns() - start);
  return polled;
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  const ContextRecord* record = context_records().find(cq->context);
  if (__builtin_expect(record == nullptr, 0)) return EINVAL;
  FailoverEngine::instance().on_req_notify(cq, solicited_only);
  if (__builtin_expect(!log_enabled(LogLevel::kTrace), 1)) {
    return record->ops.req_notify_cq(cq, solicited_only);
  }
  return intercept("ibv_req_notify_cq", VF_ARGS("{} solicited_only={}", describe_cq(cq),
                                                solicited_only),
                   [&] { return record->ops.req_notify_cq(cq, solicited_only); });
}

ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  const ContextRecord* record = context_records().find(context);
  if (record == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return intercept(
      "ibv_create_cq_ex",
      VF_ARGS("{} cqe={} wc_flags={:#x} comp_mask={:#x}", describe_context(context), attr->cqe,
              attr->wc_flags, attr->comp_mask),
      [&] {
        ibv_cq_ex* cq = record->create_cq_ex(context, attr);
        if (cq != nullptr && shim_active()) {
          std::lock_guard lock(lifecycle_mutex());
          manage_cq_ex(cq);
        }
        return cq;
      });
}

namespace {

const CqExRecord* cq_ex_record(ibv_cq_ex* cq) { return cq_ex_records().find(cq); }

int cq_ex_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  const CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return EINVAL;
  const int result = record->original.start_poll(cq, attr);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0) && result != ENOENT) {
    log(LogLevel::kTrace, "ibv_start_poll(cq={}) = {} wr_id={:#x} status={}", fmt::ptr(cq), result,
        cq->wr_id, static_cast<int>(cq->status));
  }
  return result;
}

int cq_ex_next_poll(ibv_cq_ex* cq) {
  const CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return EINVAL;
  const int result = record->original.next_poll(cq);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0) && result != ENOENT) {
    log(LogLevel::kTrace, "ibv_next_poll(cq={}) = {} wr_id={:#x} status={}", fmt::ptr(cq), result,
        cq->wr_id, static_cast<int>(cq->status));
  }
  return result;
}

void cq_ex_end_poll(ibv_cq_ex* cq) {
  const CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return;
  record->original.end_poll(cq);
}

}  // namespace

void install_cq_ex_hooks(ibv_cq_ex* cq) {
  cq->start_poll = cq_ex_start_poll;
  cq->next_poll = cq_ex_next_poll;
  cq->end_poll = cq_ex_end_poll;
}

}  // namespace vf::shim::ops
