// Asynchronous events (port state, QP/CQ errors). The failover issue filters these; here they
// pass through unchanged.
#include <infiniband/verbs.h>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

VF_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  return intercept("ibv_get_async_event", VF_ARGS("{}", describe_context(context)), [&] {
    int result = real_verbs().ibv_get_async_event(context, event);
    // Events of protected ports and QPs are the shim's business: the application waits on.
    while (result == 0 && vf::shim::shim_active() &&
           vf::FailoverEngine::instance().hide_async_event(context, *event)) {
      real_verbs().ibv_ack_async_event(event);
      result = real_verbs().ibv_get_async_event(context, event);
    }
    if (result == 0 && log_enabled(vf::LogLevel::kDebug)) {
      VF_LOG_DEBUG("async event {} on {}", static_cast<int>(event->event_type),
                   describe_context(context));
    }
    return result;
  });
}

VF_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  intercept("ibv_ack_async_event",
            VF_ARGS("event={}", event ? static_cast<int>(event->event_type) : -1),
            [&] { real_verbs().ibv_ack_async_event(event); });
}
