// CQ creation on a completion channel whose fd the shim replaced (core/failover/channel_wakeup.h):
// the provider must get the channel's real event file, through a copy, and the CQ made is then
// the application's channel's. One place for every creation hook (cq_hooks.cc: ibv_create_cq,
// ibv_create_cq_ex; dv_cq_hooks.cc: mlx5dv_create_cq, efadv_create_cq).
#pragma once

#include <infiniband/verbs.h>

#include "core/failover_engine.h"
#include "shim/shim_state.h"

namespace vf::shim {

// create(channel to give the provider) -> ibv_cq*.
template <typename Create>
ibv_cq* create_with_real_channel(ibv_comp_channel* channel, Create create) {
  if (channel == nullptr || !shim_active()) return create(channel);
  auto& engine = FailoverEngine::instance();
  ibv_comp_channel kernel_view{};
  ibv_comp_channel* given = engine.channel_for_provider(channel, kernel_view);
  if (given == channel) return create(channel);
  ibv_cq* cq = create(given);
  if (cq != nullptr) engine.adopt_channel(cq, channel, kernel_view);
  return cq;
}

// create(attr to give the provider) -> ibv_cq_ex*. A copy of attr carries the real channel: the
// application's attr may be shared by threads creating CQs at once.
template <typename Create>
ibv_cq_ex* create_with_real_channel(ibv_cq_init_attr_ex* attr, Create create) {
  if (attr == nullptr) return create(attr);
  ibv_cq_init_attr_ex given_attr = *attr;
  ibv_cq_ex* made = nullptr;
  create_with_real_channel(attr->channel, [&](ibv_comp_channel* given) -> ibv_cq* {
    given_attr.channel = given;
    made = create(given == attr->channel ? attr : &given_attr);
    return made != nullptr ? ibv_cq_ex_to_cq(made) : nullptr;
  });
  return made;
}

}  // namespace vf::shim
