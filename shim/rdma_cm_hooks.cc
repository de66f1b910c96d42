// librdmacm's entry points the shim takes (issue 20 item 9, docs/design.md §5j): an rdma_cm
// connection whose primary rail is cut must still end as it does without a fault. The side that
// calls rdma_disconnect tells the peer's shim over the control channel first (the CM's DREQ
// travels over the dead rail), and the peer's shim gives its application the
// RDMA_CM_EVENT_DISCONNECTED through rdma_get_cm_event (core/cm_events.h).
//
// librdmacm is not linked: a program that uses it has it loaded, and the real functions are
// found after the shim (RTLD_NEXT), or in a librdmacm opened RTLD_LOCAL. librdmacm calls these
// through its own PLT too (ucma_complete reads events with rdma_get_cm_event): they must behave
// as the real ones for every event that is not the shim's. No re-entry guard here: librdmacm
// calls verbs (ibv_open_device, ibv_modify_qp) inside them, and those must reach the engine.
#include <dlfcn.h>
#include <errno.h>
#include <rdma/rdma_cma.h>

#include <mutex>

#include "core/cm_events.h"
#include "core/failover_engine.h"
#include "core/log.h"
#include "shim/export.h"
#include "shim/shim_state.h"

namespace {

constexpr const char* kRdmaCmVersion = "RDMACM_1.0";
constexpr const char* kRdmaCmLibrary = "librdmacm.so.1";

// A librdmacm opened RTLD_LOCAL is not after the shim in the global scope: it is found by name.
// The handle's reference is kept for good (as real_verbs.cc keeps libibverbs'): the pointers
// below are cached for the process's life, and a program that dlclose()s librdmacm must not
// leave them pointing at unmapped code.
void* librdmacm_handle() {
  static void* const handle = dlopen(kRdmaCmLibrary, RTLD_NOW | RTLD_NOLOAD);
  return handle;
}

template <typename F>
F find_real(const char* name) {
  (void)librdmacm_handle();  // the reference, taken whichever way the symbol is found
  void* symbol = dlvsym(RTLD_NEXT, name, kRdmaCmVersion);
  if (symbol == nullptr && librdmacm_handle() != nullptr) {
    symbol = dlvsym(librdmacm_handle(), name, kRdmaCmVersion);
  }
  return reinterpret_cast<F>(symbol);
}

struct RealRdmaCm {
  vf::RdmaCmApi api;
  int (*disconnect)(rdma_cm_id*) = nullptr;
  bool complete = false;
};

void disconnected(ibv_qp* qp, std::uint32_t qpn);

// Found at the first call (librdmacm is loaded by then: its user called in). The engine's
// handler is set at the same time: only a process that uses rdma_cm needs it.
const RealRdmaCm& real_rdma_cm() {
  static const RealRdmaCm real = [] {
    // The shim's state first: whichever of these functions comes first decides the handler.
    vf::shim::ensure_initialized();
    RealRdmaCm r;
    r.api.get_cm_event = find_real<decltype(r.api.get_cm_event)>("rdma_get_cm_event");
    r.api.ack_cm_event = find_real<decltype(r.api.ack_cm_event)>("rdma_ack_cm_event");
    r.api.create_id = find_real<decltype(r.api.create_id)>("rdma_create_id");
    r.api.resolve_addr = find_real<decltype(r.api.resolve_addr)>("rdma_resolve_addr");
    r.api.destroy_id = find_real<decltype(r.api.destroy_id)>("rdma_destroy_id");
    r.disconnect = find_real<decltype(r.disconnect)>("rdma_disconnect");
    r.complete = r.api.get_cm_event != nullptr && r.api.ack_cm_event != nullptr &&
                 r.api.create_id != nullptr && r.api.resolve_addr != nullptr &&
                 r.api.destroy_id != nullptr && r.disconnect != nullptr;
    if (!r.complete) {
      VF_LOG_ERROR("rdma_cm: some of librdmacm's functions (version {}) were not found; the "
                   "shim's rdma_cm hooks pass calls on as they are",
                   kRdmaCmVersion);
    } else if (vf::shim::shim_active()) {
      vf::FailoverEngine::instance().set_cm_disconnect_handler(disconnected);
    }
    return r;
  }();
  return real;
}

// Never destroyed: the engine's thread and the application's threads blocked in
// rdma_get_cm_event may still use it while the process exits (the engine is kept the same way).
vf::CmEvents& cm_events() {
  static vf::CmEvents* const events = new vf::CmEvents(real_rdma_cm().api);
  return *events;
}

void disconnected(ibv_qp* qp, std::uint32_t qpn) {
  cm_events().disconnected(qp, qpn);
}

// A missing librdmacm function fails as librdmacm's own calls do: -1 with errno.
int missing() {
  errno = ENOSYS;
  return -1;
}

}  // namespace

VF_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  const RealRdmaCm& real = real_rdma_cm();
  if (real.api.get_cm_event == nullptr) return missing();
  if (!real.complete || !vf::shim::shim_active()) return real.api.get_cm_event(channel, event);
  return cm_events().get_event(channel, event);
}

VF_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  const RealRdmaCm& real = real_rdma_cm();
  if (real.complete && cm_events().ack_own_event(event)) return 0;
  return real.api.ack_cm_event != nullptr ? real.api.ack_cm_event(event) : missing();
}

VF_EXPORT int rdma_destroy_id(rdma_cm_id* id) {
  const RealRdmaCm& real = real_rdma_cm();
  if (!real.complete || id == nullptr) {
    return real.api.destroy_id != nullptr ? real.api.destroy_id(id) : missing();
  }
  cm_events().before_destroy(id);
  const int result = real.api.destroy_id(id);
  const int error = errno;
  cm_events().after_destroy(id);
  errno = error;
  return result;
}

VF_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  const RealRdmaCm& real = real_rdma_cm();
  if (real.disconnect == nullptr) return missing();
  // Before the CM's request: the peer's shim must know before this process may exit. An id that
  // already got its DISCONNECTED (the peer's, through the CM or its shim) tells nobody: the peer
  // started it and may be gone. Once the peer's shim confirmed, the engine gives this id its
  // own DISCONNECTED after the grace unless the CM's answer comes first (a synchronous id waits
  // for it in this very call).
  if (real.complete && vf::shim::shim_active() && id != nullptr && id->qp != nullptr &&
      !cm_events().disconnect_shown(id)) {
    vf::FailoverEngine::instance().announce_cm_disconnect(id->qp);
  }
  return real.disconnect(id);
}
