#include "shim/shim_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <mutex>

#include "core/log.h"
#include "core/failover_engine.h"
#include "shim/crash_handler.h"
#include "shim/failover_bridge.h"
#include "shim/object_records.h"
#include "shim/port_monitor.h"
#include "shim/real_verbs.h"

namespace vf::shim {
namespace {

// A function-local static, not a global: hooks and the constructor can run before this file's
// dynamic initialisers (another library's constructor may call a verb first).
Config& config_storage() {
  static Config config;
  return config;
}
constinit std::mutex g_init_mutex;

constexpr std::size_t kMaxForkParticipants = 8;
std::array<ForkParticipant, kMaxForkParticipants> g_fork_participants{};
std::atomic<std::size_t> g_fork_participant_count{0};

// The initialisation lock is taken first, so a fork while another thread initialises cannot
// leave the child with it held.
void fork_prepare() {
  g_init_mutex.lock();
  const std::size_t count = g_fork_participant_count.load();
  for (std::size_t i = 0; i < count; ++i) g_fork_participants[i].prepare();
}
void fork_parent() {
  for (std::size_t i = g_fork_participant_count.load(); i-- > 0;) g_fork_participants[i].parent();
  g_init_mutex.unlock();
}
void fork_child() {
  for (std::size_t i = g_fork_participant_count.load(); i-- > 0;) g_fork_participants[i].child();
  g_init_mutex.unlock();
}

// Configuration problems go to stderr whatever the log settings are: the variable that is wrong
// may be the one that says where logs go.
void report_problem(const std::string& line) {
  const std::string text = "verbs-failover: " + line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace

namespace state_detail {

void initialize_slow() {
  std::lock_guard lock(g_init_mutex);
  if (g_initialized.load(std::memory_order_relaxed)) return;
  const auto lookup = [](std::string_view name) -> std::optional<std::string> {
    const char* value = ::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
  ConfigResult parsed = parse_config(lookup, static_cast<int>(::getpid()));
  Config& g_config = config_storage();
  g_config = parsed.config;
  for (const std::string& problem : parsed.problems) report_problem(problem);
  if (std::string error = log_configure(g_config.log_level, g_config.log_file); !error.empty()) {
    report_problem(error);
  }
  g_active.store(g_config.enabled, std::memory_order_relaxed);
  register_records_for_fork();
  register_port_monitor_for_fork();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  if (g_config.backtrace) install_crash_handler();
  if (g_config.enabled) {
    configure_failover(g_config);
    // No libibverbs to reach (real_verbs.cc said so at info): every hook a program could still
    // find (dlsym) passes straight on, and no dlopen is redirected.
    if (real_verbs().handle == nullptr) g_active.store(false, std::memory_order_relaxed);
    register_fork_participant({[] { FailoverEngine::instance().lock_for_fork(); },
                               [] { FailoverEngine::instance().unlock_after_fork(); },
                               [] { FailoverEngine::instance().forget_after_fork(); }});
  }
  VF_LOG_DEBUG("initialised: hooks {}, log level {}, backtrace {}",
               g_config.enabled ? "active" : "disabled (VERBS_FAILOVER=0)",
               log_level_name(g_config.log_level), g_config.backtrace ? "on" : "off");
  g_initialized.store(true, std::memory_order_release);
}

}  // namespace state_detail

const Config& config() {
  ensure_initialized();
  return config_storage();
}

void register_fork_participant(ForkParticipant participant) {
  // Called during initialisation only, under g_init_mutex (taken by initialize_slow).
  const std::size_t index = g_fork_participant_count.load();
  if (index < kMaxForkParticipants) {
    g_fork_participants[index] = participant;
    g_fork_participant_count.store(index + 1);
  }
}

// The constructor only reads the environment: it opens no device and starts no thread, because
// LD_PRELOAD puts the shim into every process of a job (launchers, shells, helpers).
__attribute__((constructor)) static void shim_constructor() { ensure_initialized(); }

}  // namespace vf::shim
