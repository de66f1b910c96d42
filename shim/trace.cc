#include "shim/trace.h"

#include <infiniband/verbs.h>
#include <string.h>

namespace vf::shim {

void emit_trace(const char* verb, const TraceBuffer& args, const TraceBuffer* result, int error,
                std::uint64_t elapsed_ns) {
  std::string stack;
  if (config().backtrace) stack = " caller:" + caller_stack();
  const std::string_view arg_text(args.data(), args.size());
  if (result != nullptr) {
    log_detail::write_line(
        LogLevel::kTrace,
        fmt::format("{}({}) = {} errno={}{}{} ({} ns){}", verb, arg_text,
                    std::string_view(result->data(), result->size()), error,
                    error != 0 ? " " : "", error != 0 ? strerrorname_np(error) : "", elapsed_ns,
                    stack));
  } else {
    log_detail::write_line(LogLevel::kTrace, fmt::format("{}({}) errno={} ({} ns){}", verb,
                                                         arg_text, error, elapsed_ns, stack));
  }
}

std::string describe_context(const ibv_context* context) {
  if (context == nullptr) return "ctx=NULL";
  const char* name = context->device != nullptr ? context->device->name : "?";
  return fmt::format("ctx={}({})", fmt::ptr(context), name);
}

std::string describe_qp(const ibv_qp* qp) {
  if (qp == nullptr) return "qp=NULL";
  return fmt::format("qp={}(qpn={})", fmt::ptr(qp), qp->qp_num);
}

std::string describe_send_wr_chain(const ibv_send_wr* wr) {
  std::string out;
  int count = 0;
  for (; wr != nullptr; wr = wr->next, ++count) {
    if (count < 4) {
      const unsigned length = wr->num_sge > 0 && wr->sg_list != nullptr ? wr->sg_list[0].length : 0;
      out += fmt::format("{}{{wr_id={:#x} op={} sge={} len={} flags={:#x}}}", count ? " " : "",
                         wr->wr_id, static_cast<int>(wr->opcode), wr->num_sge, length,
                         wr->send_flags);
    }
  }
  if (count > 4) out += fmt::format(" +{} more", count - 4);
  return fmt::format("wrs={} [{}]", count, out);
}

std::string describe_recv_wr_chain(const ibv_recv_wr* wr) {
  std::string out;
  int count = 0;
  for (; wr != nullptr; wr = wr->next, ++count) {
    if (count < 4) {
      out += fmt::format("{}{{wr_id={:#x} sge={}}}", count ? " " : "", wr->wr_id, wr->num_sge);
    }
  }
  if (count > 4) out += fmt::format(" +{} more", count - 4);
  return fmt::format("wrs={} [{}]", count, out);
}

std::string describe_wc(const ibv_wc* wc, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    out += fmt::format("{}{{wr_id={:#x} status={} opcode={} qpn={} len={} imm={:#x} flags={:#x}}}",
                       i ? " " : "", wc[i].wr_id, static_cast<int>(wc[i].status),
                       static_cast<int>(wc[i].opcode), wc[i].qp_num, wc[i].byte_len,
                       wc[i].imm_data, wc[i].wc_flags);
  }
  return out;
}

}  // namespace vf::shim
