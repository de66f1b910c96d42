// Names of verbs enums for log lines and the stats file.
#pragma once

#include <infiniband/verbs.h>

namespace vf {

inline const char* port_state_name(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

}  // namespace vf
