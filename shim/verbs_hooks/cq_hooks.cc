// Completion queues: creation (classic and extended), destruction, and the polling functions.
#include <infiniband/verbs.h>

#include <mutex>

#include "core/datapath_registries.h"
#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/object_records.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"
#include "shim/verbs_hooks/real_channel.h"

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
                     ibv_cq* cq = vf::shim::create_with_real_channel(
                         channel, [&](ibv_comp_channel* given) {
                           return real_verbs().ibv_create_cq(context, cqe, cq_context, given,
                                                             comp_vector);
                         });
                     if (cq != nullptr && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_cq_created(cq, channel);
                     }
                     return cq;
                   });
}

VF_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  return intercept("ibv_resize_cq", VF_ARGS("{} new_cqe={}", describe_cq(cq), cqe),
                   [&] {
                     const int result = real_verbs().ibv_resize_cq(cq, cqe);
                     if (result == 0 && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_cq_resized(cq);
                     }
                     return result;
                   });
}

VF_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  return intercept("ibv_destroy_cq", VF_ARGS("{}", describe_cq(cq)), [&] {
    if (!vf::shim::shim_active()) return real_verbs().ibv_destroy_cq(cq);
    // As libibverbs waits for every event of the CQ to be acknowledged, the shim waits for the
    // shadow events it handed out: acknowledged after the CQ left the engine's records, they
    // would be counted against the real CQ, and the real destroy would wait for ever.
    vf::FailoverEngine::instance().close_cq_events(cq);
    vf::FailoverEngine::instance().on_cq_destroy(cq);
    std::lock_guard lock(vf::shim::lifecycle_mutex());
    const int result = real_verbs().ibv_destroy_cq(cq);
    if (result == 0) vf::shim::forget_cq(cq);
    return result;
  });
}

namespace vf::shim::ops {

// The traced variant (VERBS_FAILOVER_TRACE): out of line, so that the plain path stays small.
[[gnu::noinline, gnu::cold]] int poll_cq_traced(ibv_cq* cq, CqState* state, int num_entries,
                                                ibv_wc* wc) {
  const ContextRecord* record = state == nullptr ? context_records().find(cq->context) : nullptr;
  if (state == nullptr && record == nullptr) return -1;
  const std::uint64_t start = monotonic_ns();
  const int polled = state != nullptr ? state->poll(num_entries, wc)
                                      : record->ops.poll_cq(cq, num_entries, wc);
  trace_poll("ibv_poll_cq", cq, num_entries, wc, polled, monotonic_ns() - start);
  return polled;
}

int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  CqState* state = find_cq_state(cq);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0)) {
    return poll_cq_traced(cq, state, num_entries, wc);
  }
  if (state != nullptr) return state->poll(num_entries, wc);
  const ContextRecord* record = context_records().find(cq->context);
  if (__builtin_expect(record == nullptr, 0)) return -1;
  return record->ops.poll_cq(cq, num_entries, wc);
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
        ibv_cq_ex* cq = create_with_real_channel(
            attr, [&](ibv_cq_init_attr_ex* given) { return record->create_cq_ex(context, given); });
        if (cq != nullptr && shim_active()) {
          std::lock_guard lock(lifecycle_mutex());
          manage_cq_ex(cq);
          // Its completions can come from two paths only if every field the application asked
          // for is one an ibv_wc carries (no timestamps, VLAN, flow tag or tag matching).
          CqExRecord* managed = cq_ex_records().find(cq);
          if (managed != nullptr && (attr->wc_flags & ~kFailoverCqExFields) == 0 &&
              !(attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS &&
                attr->flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
            ibv_cq* plain = ibv_cq_ex_to_cq(cq);
            FailoverEngine::instance().on_cq_created(plain, attr->channel);
            managed->failover = FailoverEngine::instance().cq_state(plain);
            if (managed->failover != nullptr) install_cq_ex_readers(cq);
          }
        }
        return cq;
      });
}

namespace {

CqExRecord* cq_ex_record(ibv_cq_ex* cq) { return cq_ex_records().find(cq); }

// ---- a CQ the failover engine manages: the iterator over completions polled through it

// Exposes the completion at record->index, polling a new batch when the last one is used up.
int expose_next(ibv_cq_ex* cq, CqExRecord& record) {
  if (record.index >= record.count) {
    const int polled = record.failover->poll(CqExRecord::kBatch, record.batch);
    record.index = 0;
    record.count = polled > 0 ? polled : 0;
    if (polled < 0) return EINVAL;
    if (polled == 0) return ENOENT;
  }
  const ibv_wc& wc = record.batch[record.index];
  cq->wr_id = wc.wr_id;
  cq->status = wc.status;
  record.exposed = true;
  return 0;
}

const ibv_wc& exposed_wc(ibv_cq_ex* cq) {
  const CqExRecord* record = cq_ex_record(cq);
  return record->batch[record->index];
}

int managed_start_poll(ibv_cq_ex* cq, CqExRecord& record) {
  record.exposed = false;
  return expose_next(cq, record);
}

int managed_next_poll(ibv_cq_ex* cq, CqExRecord& record) {
  if (record.exposed) ++record.index;
  record.exposed = false;
  return expose_next(cq, record);
}

void managed_end_poll(CqExRecord& record) {
  // The exposed completion was the application's; the rest of the batch waits for the next.
  if (record.exposed) ++record.index;
  record.exposed = false;
}

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) { return exposed_wc(cq).opcode; }
uint32_t read_vendor_err(ibv_cq_ex* cq) { return exposed_wc(cq).vendor_err; }
uint32_t read_byte_len(ibv_cq_ex* cq) { return exposed_wc(cq).byte_len; }
__be32 read_imm_data(ibv_cq_ex* cq) { return exposed_wc(cq).imm_data; }
uint32_t read_qp_num(ibv_cq_ex* cq) { return exposed_wc(cq).qp_num; }
uint32_t read_src_qp(ibv_cq_ex* cq) { return exposed_wc(cq).src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* cq) { return exposed_wc(cq).wc_flags; }
uint32_t read_slid(ibv_cq_ex* cq) { return exposed_wc(cq).slid; }
uint8_t read_sl(ibv_cq_ex* cq) { return exposed_wc(cq).sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* cq) { return exposed_wc(cq).dlid_path_bits; }

int cq_ex_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return EINVAL;
  const int result = record->failover != nullptr ? managed_start_poll(cq, *record)
                                                 : record->original.start_poll(cq, attr);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0) && result != ENOENT) {
    log(LogLevel::kTrace, "ibv_start_poll(cq={}) = {} wr_id={:#x} status={}", fmt::ptr(cq), result,
        cq->wr_id, static_cast<int>(cq->status));
  }
  return result;
}

int cq_ex_next_poll(ibv_cq_ex* cq) {
  CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return EINVAL;
  const int result = record->failover != nullptr ? managed_next_poll(cq, *record)
                                                 : record->original.next_poll(cq);
  if (__builtin_expect(log_enabled(LogLevel::kTrace), 0) && result != ENOENT) {
    log(LogLevel::kTrace, "ibv_next_poll(cq={}) = {} wr_id={:#x} status={}", fmt::ptr(cq), result,
        cq->wr_id, static_cast<int>(cq->status));
  }
  return result;
}

void cq_ex_end_poll(ibv_cq_ex* cq) {
  CqExRecord* record = cq_ex_record(cq);
  if (__builtin_expect(record == nullptr, 0)) return;
  if (record->failover != nullptr) return managed_end_poll(*record);
  record->original.end_poll(cq);
}

}  // namespace

void install_cq_ex_readers(ibv_cq_ex* cq) {
  cq->read_opcode = read_opcode;
  cq->read_vendor_err = read_vendor_err;
  cq->read_byte_len = read_byte_len;
  cq->read_imm_data = read_imm_data;
  cq->read_qp_num = read_qp_num;
  cq->read_src_qp = read_src_qp;
  cq->read_wc_flags = read_wc_flags;
  cq->read_slid = read_slid;
  cq->read_sl = read_sl;
  cq->read_dlid_path_bits = read_dlid_path_bits;
}

void install_cq_ex_hooks(ibv_cq_ex* cq) {
  cq->start_poll = cq_ex_start_poll;
  cq->next_poll = cq_ex_next_poll;
  cq->end_poll = cq_ex_end_poll;
}

}  // namespace vf::shim::ops
