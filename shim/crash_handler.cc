#include "shim/crash_handler.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>

#include "core/backtrace.h"
#include "core/log.h"

namespace vf::shim {
namespace {

constexpr std::array kFatalSignals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
std::array<struct sigaction, kFatalSignals.size()> g_previous{};

void on_fatal_signal(int signo, siginfo_t* info, void* /*ucontext*/) {
  const int fd = log_fd();
  // No heap, no locale, no stdio: fmt formats into a stack buffer; sigabbrev_np returns a
  // constant string.
  char header[200];
  const char* abbrev = sigabbrev_np(signo);
  const auto header_end = fmt::format_to_n(
      header, sizeof(header), "verbs-failover[{}]: fatal signal {} (SIG{}) at address {}; stack:\n",
      static_cast<int>(getpid()), signo, abbrev != nullptr ? abbrev : "?",
      fmt::ptr(info != nullptr ? info->si_addr : nullptr));
  ssize_t ignored = ::write(fd, header, header_end.size);
  (void)ignored;
  write_stack_to_fd(fd);
  // Hand the signal to whoever had it before us; returning re-executes the faulting instruction
  // (or re-raises for abort) under that disposition, so the process dies as it would have.
  for (std::size_t i = 0; i < kFatalSignals.size(); ++i) {
    if (kFatalSignals[i] == signo) sigaction(signo, &g_previous[i], nullptr);
  }
  if (signo == SIGABRT || info == nullptr || info->si_code <= 0) raise(signo);
}

}  // namespace

void install_crash_handler() {
  // Loaded now: the signal handler must not be the first to dlopen libunwind.
  if (!backtraces_available()) {
    VF_LOG_WARN("VERBS_FAILOVER_BACKTRACE=1 but libunwind.so.8 cannot be loaded: crashes and "
                "trace lines will carry no stack");
  }
  struct sigaction action {};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < kFatalSignals.size(); ++i) {
    sigaction(kFatalSignals[i], &action, &g_previous[i]);
  }
}

}  // namespace vf::shim
