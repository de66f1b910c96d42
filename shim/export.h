#pragma once
// The shim is built with hidden visibility; only verbs hooks, the dlopen hook and the
// verbs_failover_* debug entry points are exported, each under the version node the linker
// script (libverbs_failover.map) gives it.
#define VF_EXPORT extern "C" __attribute__((visibility("default")))
