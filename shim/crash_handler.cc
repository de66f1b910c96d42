#include "shim/crash_handler.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <array>

#include "core/backtrace.h"
#include "core/log.h"

namespace vf::shim {
namespace {

constexpr std::array kFatalSignals = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
std::array<struct sigaction, kFatalSignals.size()> g_previous{};

void on_fatal_signal(int signo, siginfo_t* info, void* /*ucontext*/) {
  const int fd = log_fd();
  char header[160];
  const int length = snprintf(header, sizeof(header),
                              "verbs-failover[%d]: fatal signal %d (%s) at address %p; stack:\n",
                              static_cast<int>(getpid()), signo, strsignal(signo),
                              info != nullptr ? info->si_addr : nullptr);
  if (length > 0) {
    ssize_t ignored = ::write(fd, header, static_cast<size_t>(length));
    (void)ignored;
  }
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
  struct sigaction action {};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < kFatalSignals.size(); ++i) {
    sigaction(kFatalSignals[i], &action, &g_previous[i]);
  }
}

}  // namespace vf::shim
