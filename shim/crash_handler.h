#pragma once

namespace vf::shim {
// With VERBS_FAILOVER_BACKTRACE=1: a fatal signal prints the faulting thread's stack to the log,
// then the previous disposition runs (the application's handler, or the default core dump).
void install_crash_handler();
}  // namespace vf::shim
