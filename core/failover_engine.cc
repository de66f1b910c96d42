// The public face of the failover engine (failover_engine.h): one Engine per process, each entry
// point taking its mutex and handing the call to the room of core/failover/ that owns it
// (docs/design.md §5 has the map). Nothing here decides anything.
#include "core/failover_engine.h"

#include <mutex>
#include <string>
#include <utility>

#include "core/failover/channel_wakeup.h"
#include "core/failover/cm_disconnect.h"
#include "core/failover/cq_shadows.h"
#include "core/failover/engine_state.h"
#include "core/failover/engine_stats.h"
#include "core/failover/engine_thread.h"
#include "core/failover/memory_mirror.h"
#include "core/failover/port_events.h"
#include "core/failover/qp_lifecycle.h"
#include "core/failover/srq_group.h"

namespace vf {

using failover::Engine;

namespace {

Engine& engine() {
  static Engine* instance = new Engine;  // never destroyed: the thread may outlive main
  return *instance;
}

}  // namespace

FailoverEngine& FailoverEngine::instance() {
  static FailoverEngine engine_interface;
  return engine_interface;
}

void FailoverEngine::configure(const Config& config, const VerbsApi& verbs, std::string program) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.config = config;
  e.port_stable_ns = static_cast<std::uint64_t>(config.port_stable_ms) * 1'000'000;
  e.grace_ns = static_cast<std::uint64_t>(config.grace_ms) * 1'000'000;
  e.probe_interval_ns = static_cast<std::uint64_t>(config.probe_ms) * 1'000'000;
  e.verbs = verbs;
  e.program = std::move(program);
  e.configured = true;
}

bool FailoverEngine::running() const {
  return failover::engine_running(engine());
}

void FailoverEngine::on_device_opened(ibv_context* /*context*/) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  if (!e.configured) return;
  failover::start_engine(e);
}

// The same lookups the data-path hooks make (core/datapath_registries.h).
VirtualQp* FailoverEngine::virtual_qp(const ibv_qp* qp) const {
  return find_virtual_qp(qp);
}
CqState* FailoverEngine::cq_state(const ibv_cq* cq) const {
  return find_cq_state(cq);
}
VirtualSrq* FailoverEngine::virtual_srq(const ibv_srq* srq) const {
  return find_virtual_srq(srq);
}

void FailoverEngine::on_cq_created(ibv_cq* cq, ibv_comp_channel* channel) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::cq_created(e, cq, channel);
}

void FailoverEngine::on_cq_destroy(ibv_cq* cq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::cq_destroying(e, cq);
}

void FailoverEngine::on_cq_resized(ibv_cq* cq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::cq_resized(e, cq);
}

void FailoverEngine::on_pd_destroy(ibv_pd* pd) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::pd_destroying(e, pd);
}

void FailoverEngine::on_srq_created(ibv_srq* srq, ibv_pd* pd) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::srq_created(e, srq, pd);
}

void FailoverEngine::on_srq_modified(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::srq_modified(e, srq, attr, mask);
}

void FailoverEngine::on_srq_destroyed(ibv_srq* srq) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::srq_destroyed(e, srq);
}

void FailoverEngine::on_qp_created(ibv_qp* qp, const ibv_qp_init_attr_ex& attr) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::qp_created(e, qp, attr);
}

int FailoverEngine::modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask,
                              int (*real)(ibv_qp*, ibv_qp_attr*, int)) {
  VirtualQp* v = virtual_qp(qp);
  if (v == nullptr || attr == nullptr) return real(qp, attr, mask);
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  return failover::modify_app_qp(e, v, qp, attr, mask, real);
}

void FailoverEngine::on_qp_queried(ibv_qp* qp, ibv_qp_attr* attr, int mask,
                                   ibv_qp_state application_view) {
  failover::qp_queried(qp, attr, mask, application_view);
}

void FailoverEngine::on_qp_destroy(ibv_qp* qp) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::qp_destroying(e, qp);
}

void FailoverEngine::on_mr_registered(ibv_mr* mr, void* addr, std::size_t length,
                                      std::uint64_t iova, unsigned int access, int dmabuf_fd,
                                      std::uint64_t dmabuf_offset) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::mr_registered(e, mr, addr, length, iova, access, dmabuf_fd, dmabuf_offset);
}

void FailoverEngine::on_mr_reregistered(ibv_mr* mr, int flags, std::uint32_t old_lkey,
                                        std::uint32_t old_rkey, int access) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::mr_reregistered(e, mr, flags, old_lkey, old_rkey, access);
}

void FailoverEngine::on_mr_deregister(ibv_mr* mr) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::mr_deregistering(e, mr);
}

bool FailoverEngine::hide_async_event(ibv_context* context, const ibv_async_event& event) {
  Engine& e = engine();
  if (!running()) return false;
  std::lock_guard lock(e.mutex);
  return failover::hide_async_event(e, context, event);
}

void FailoverEngine::on_comp_channel_created(ibv_comp_channel* channel) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  failover::channel_created(e, channel);
}

ibv_comp_channel* FailoverEngine::channel_for_provider(ibv_comp_channel* channel,
                                                       ibv_comp_channel& kernel_view) {
  if (channel == nullptr) return nullptr;
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  return failover::channel_for_provider(e, channel, kernel_view);
}

void FailoverEngine::adopt_channel(ibv_cq* cq, ibv_comp_channel* channel,
                                   const ibv_comp_channel& kernel_view) {
  failover::adopt_channel(cq, channel, kernel_view);
}

int FailoverEngine::destroy_comp_channel(ibv_comp_channel* channel,
                                         int (*real)(ibv_comp_channel*)) {
  return failover::destroy_channel(engine(), channel, real);
}

int FailoverEngine::get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  return failover::get_cq_event(engine(), channel, cq, cq_context);
}

void FailoverEngine::close_cq_events(ibv_cq* cq) {
  CqState* state = find_cq_state(cq);
  if (state == nullptr) return;
  {
    Engine& e = engine();
    std::lock_guard lock(e.mutex);
    if (!failover::cq_close_events(e, cq)) return;  // the destroy will be refused: no wait
  }
  state->shadow_events.wait_acknowledged();
}

unsigned int FailoverEngine::ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  return failover::ack_cq_events(cq, nevents);
}

void FailoverEngine::on_req_notify(ibv_cq* cq, int solicited_only) {
  failover::req_notify(cq, solicited_only);
}

void FailoverEngine::write_stats(const char* reason) {
  failover::write_stats(engine(), reason);
}

void FailoverEngine::set_first_hold_down(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.first_hold_down_ns = nanoseconds;
}

void FailoverEngine::set_resume_late(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.resume_late_ns = nanoseconds;
}

int FailoverEngine::lose_control_messages(std::string_view kind, unsigned count) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  for (std::size_t i = 0; i < kControlMessageNames.size(); ++i) {
    if (kControlMessageNames[i] != kind) continue;
    if (count > 0) e.channel.lose_next(i, count);
    return static_cast<int>(e.channel.still_to_lose(i));
  }
  return -1;
}

void FailoverEngine::set_rearm_retry(std::uint64_t nanoseconds) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.rearm_retry_ns = nanoseconds;
}

int FailoverEngine::protection_of(std::uint32_t qpn, std::string& reason) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  return failover::protection_of(e, qpn, reason);
}

bool FailoverEngine::announce_cm_disconnect(ibv_qp* qp) {
  VirtualQp* v = find_virtual_qp(qp);
  if (v == nullptr) return false;
  Engine& e = engine();
  std::unique_lock lock(e.mutex);
  if (!engine_running(e)) return false;
  return failover::announce_cm_disconnect(e, lock, v, failover::kCmDisconnectWaitNs) ==
         failover::CmAnnounce::kAnswered;
}

void FailoverEngine::set_cm_disconnect_handler(void (*handler)(ibv_qp* qp, std::uint32_t qpn)) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  e.cm_disconnect_handler = handler;
}

int FailoverEngine::switches_of(std::uint32_t qpn, std::uint64_t* failovers,
                                std::uint64_t* failbacks) {
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  return failover::switches_of(e, qpn, failovers, failbacks);
}

void FailoverEngine::lock_for_fork() {
  // In write_stats' order: the stats file's lock, then the engine's.
  engine().stats_file_mutex.lock();
  engine().mutex.lock();
}
void FailoverEngine::unlock_after_fork() {
  engine().mutex.unlock();
  engine().stats_file_mutex.unlock();
}

void FailoverEngine::forget_after_fork() {
  Engine& e = engine();
  // The child inherits the mutex state of the fork()ing thread only (pthread_atfork runs this
  // with it taken); the engine thread does not exist in the child.
  e.channel.abandon();
  e.started = false;
  e.start_failed = true;  // the child runs unprotected (documented)
  // The stats file's name holds the parent's pid: the child's exit must not overwrite it.
  e.stats_final = true;
  e.mutex.unlock();
  e.stats_file_mutex.unlock();
}

}  // namespace vf
