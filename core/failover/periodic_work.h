// What the engine does on each wake-up besides reading events and messages: switches for link
// errors the data path saw, pairing retries and deadlines, switch and SRQ-move deadlines, missing
// key translations, re-arm retries, and the resume time of each switch.
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Each wake-up of the engine's thread, after events and messages.
void periodic_work(Engine& e);

// Whether periodic_work has something to wait for (the thread then wakes every 20 ms).
bool has_pending_work(Engine& e);

}  // namespace vf::failover
