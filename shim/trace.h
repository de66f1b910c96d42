// How every exported hook runs: lazy initialisation, the VERBS_FAILOVER=0 and re-entry bypasses,
// and — at trace level only — one line per call with arguments, result, errno and duration.
#pragma once

#include <errno.h>
#include <infiniband/verbs.h>
#include <fmt/format.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/backtrace.h"
#include "core/clock.h"
#include "core/log.h"
#include "shim/shim_state.h"

namespace vf::shim {

using TraceBuffer = fmt::memory_buffer;

template <typename R>
void format_result(TraceBuffer& out, const R& result) {
  if constexpr (std::is_pointer_v<R>) {
    if (result == nullptr) {
      fmt::format_to(std::back_inserter(out), "NULL");
    } else {
      fmt::format_to(std::back_inserter(out), "{}", fmt::ptr(result));
    }
  } else if constexpr (std::is_enum_v<R>) {
    fmt::format_to(std::back_inserter(out), "{}", static_cast<long long>(result));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", result);
  }
}

// Writes "verb(args) = result errno=E (N ns)" and, with VERBS_FAILOVER_BACKTRACE=1, the caller.
void emit_trace(const char* verb, const TraceBuffer& args, const TraceBuffer* result, int error,
                std::uint64_t elapsed_ns);

// Runs `call` (the real verb) the way the configuration asks. `describe(buffer)` writes the
// arguments that matter; it is only invoked at trace level.
template <typename Describe, typename Call>
auto intercept(const char* verb, Describe&& describe, Call&& call) -> decltype(call()) {
  using R = decltype(call());
  ensure_initialized();
  if (!shim_active() || ReentryGuard::inside()) return call();
  ReentryGuard guard;
  if (!log_enabled(LogLevel::kTrace)) return call();
  const std::uint64_t start = monotonic_ns();
  TraceBuffer args;
  describe(args);
  if constexpr (std::is_void_v<R>) {
    call();
    const int error = errno;
    emit_trace(verb, args, nullptr, error, monotonic_ns() - start);
    errno = error;
  } else {
    R result = call();
    const int error = errno;
    const std::uint64_t elapsed = monotonic_ns() - start;
    TraceBuffer formatted;
    format_result(formatted, result);
    emit_trace(verb, args, &formatted, error, elapsed);
    errno = error;
    return result;
  }
}

// For a verb this libibverbs does not export: fail the way libibverbs fails unsupported verbs.
template <typename R>
R unsupported_verb(const char* verb) {
  VF_LOG_DEBUG("{}: not provided by this libibverbs", verb);
  errno = EOPNOTSUPP;
  if constexpr (std::is_pointer_v<R>) {
    return nullptr;
  } else {
    return static_cast<R>(EOPNOTSUPP);
  }
}

// Describers used by several verb families.
std::string describe_context(const struct ibv_context* context);
std::string describe_qp(const struct ibv_qp* qp);
std::string describe_send_wr_chain(const struct ibv_send_wr* wr);
std::string describe_recv_wr_chain(const struct ibv_recv_wr* wr);
std::string describe_wc(const struct ibv_wc* wc, int count);

}  // namespace vf::shim

// Shorthand for the argument describer lambda of intercept().
#define VF_ARGS(...) [&](::vf::shim::TraceBuffer& out) { \
    fmt::format_to(std::back_inserter(out), __VA_ARGS__); }
