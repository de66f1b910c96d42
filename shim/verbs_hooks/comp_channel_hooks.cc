// Completion channels: how programs that sleep instead of busy-polling learn of completions.
#include <infiniband/verbs.h>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

VF_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  return intercept("ibv_create_comp_channel", VF_ARGS("{}", describe_context(context)),
                   [&] {
                     ibv_comp_channel* channel = real_verbs().ibv_create_comp_channel(context);
                     // Its fd must also wake for the standby path's events (channel_wakeup.h).
                     if (channel != nullptr && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_comp_channel_created(channel);
                     }
                     return channel;
                   });
}

VF_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  return intercept("ibv_destroy_comp_channel", VF_ARGS("channel={}", fmt::ptr(channel)),
                   [&] {
                     if (!vf::shim::shim_active()) {
                       return real_verbs().ibv_destroy_comp_channel(channel);
                     }
                     return vf::FailoverEngine::instance().destroy_comp_channel(
                         channel, real_verbs().ibv_destroy_comp_channel);
                   });
}

VF_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  return intercept("ibv_get_cq_event", VF_ARGS("channel={}", fmt::ptr(channel)),
                   [&] {
                     if (vf::shim::shim_active()) {
                       const int result =
                           vf::FailoverEngine::instance().get_cq_event(channel, cq, cq_context);
                       if (result != -2) return result;
                     }
                     return real_verbs().ibv_get_cq_event(channel, cq, cq_context);
                   });
}

VF_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  intercept("ibv_ack_cq_events", VF_ARGS("cq={} nevents={}", fmt::ptr(cq), nevents),
            [&] {
              const unsigned int real_events =
                  vf::shim::shim_active() ? vf::FailoverEngine::instance().ack_cq_events(cq, nevents)
                                          : nevents;
              if (real_events > 0) real_verbs().ibv_ack_cq_events(cq, real_events);
            });
}
