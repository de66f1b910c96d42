// The grace (docs/design.md §5g): a QP whose active path failed while its other path is not
// usable yet (reset after a failback and not re-armed, its port down) does not fail at once. Its
// posts are held and its error completions hidden for up to Engine::grace_ns
// (VERBS_FAILOVER_GRACE_MS); the first path usable again takes its traffic (start_switch), and
// only when none comes back does the application see the failure, as it would without the shim.
#pragma once

#include <string>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Whether `p` may wait for `target` rather than fail now: a grace is configured, the pair is on
// (paired, not ended), the application has not seen the QP fail nor made it pass-through, and
// `target` is not lost for good.
bool may_wait_for_path(const Engine& e, const Protection& p, int target);

// Begins the wait for `target` (or goes on with one under way): posts are held from here. False,
// with nothing changed, when the application made the QP pass-through as it began.
bool wait_for_path(Engine& e, Protection& p, int target, FailoverReason reason);

// Each engine pass, and when a path is re-armed: the awaited path is usable, so the traffic
// moves there; or the active path's port is back and stable with no error seen on it (a blink
// RC's retries covered), so the QP goes on there; or the grace is over (end_path_wait).
void continue_path_wait(Engine& e, Protection& p);

// No path came back (or the pair ended meanwhile): the errors held reach the application, the
// requests it posted during the wait complete as on its QP in ERR, and the QP is failed for good
// (the pair ends, the peer is told) with `why`; its active QP goes to ERR, so that nothing
// succeeds after those flushes. With no error seen and its port up and stable, the QP goes on on
// its active path instead (unprotected; the pair stays on).
void end_path_wait(Engine& e, Protection& p, const std::string& why);

}  // namespace vf::failover
