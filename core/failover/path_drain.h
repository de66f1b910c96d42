// The drain of a switch: the old path's QP in ERR gives up every completion it will ever report
// (the drain marker proves its receive queue has), before the delivered count is read.
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// Takes every completion the old path will ever report into the stash, before the delivered
// count is read. A device may write a receive's completion after it acknowledged the message
// (the sender has its success and retires the request): a drain that stopped at the first empty
// poll would count one message fewer, and the peer would have nothing left to replay. So the
// drain goes on until the marker's flush shows the receive queue has reported everything, at
// most kReceiveFlushWaitNs (a device that does not flush a QP in ERR must not stall the switch).
// A QP that could not be moved to ERR gets no marker: it would be an ordinary receive there, one
// an arriving message could consume.
void drain_old_path(Engine& e, Protection& p, int from, bool in_error);

}  // namespace vf::failover
