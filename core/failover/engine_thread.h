// The engine's thread: start (devices, listener, hello, data-path services, the thread), and its
// loop, which waits on the wake eventfd, the devices' async fds, the shadow completion channels
// and the control channel's sessions, then hands what they report to the rooms that own it and
// runs the periodic work (periodic_work.h).
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Once, at the first device the application opens: discovers devices, chooses backups, listens,
// starts the thread. False when the engine cannot run (the process then runs unprotected).
bool start_engine(Engine& e);

}  // namespace vf::failover
