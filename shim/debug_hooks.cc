// Entry points for tests and bug reports, exported under the VERBS_FAILOVER_PRIVATE node.
#include "shim/export.h"

// Lets the preload tests prove that a crash inside the shim prints a symbolised stack
// (VERBS_FAILOVER_BACKTRACE=1). Never called by the shim itself.
VF_EXPORT __attribute__((noinline)) void verbs_failover_debug_crash() {
  volatile int* null_pointer = nullptr;
  *null_pointer = 42;
}

VF_EXPORT const char* verbs_failover_version() { return VERBS_FAILOVER_VERSION; }
