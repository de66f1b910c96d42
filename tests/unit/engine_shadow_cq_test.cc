// Issue 19 item 9: a shadow CQ must not overrun where the application's CQ would not (it is
// sized for the drain markers the shim adds), and an overrun that happens anyway (a device's
// IBV_EVENT_CQ_ERR on the engine's context) is reported and acted on instead of ignored. On the
// rig of tests/unit/engine_rig.h.
#include "core/failover/cq_shadows.h"
#include "core/failover/periodic_work.h"
#include "tests/unit/engine_rig.h"

namespace {

ibv_cq* g_error_cq = nullptr;  // what the fake device's next async event names
int fake_get_async_event(ibv_context*, ibv_async_event* event) {
  *event = {};
  event->event_type = IBV_EVENT_CQ_ERR;
  event->element.cq = g_error_cq;
  return 0;
}
void fake_ack_async_event(ibv_async_event*) {}

std::vector<int> g_resized;
int fake_resize_cq(ibv_cq* cq, int cqe) {
  cq->cqe = cqe;
  g_resized.push_back(cqe);
  return 0;
}

// The rig's CQ becomes the engine's (as ibv_create_cq makes it); returns its record.
vf::CqState* register_cq(Rig& rig) {
  vf::CqState* state = rig.cq_state.get();
  rig.e->cqs[&rig.cq] = std::move(rig.cq_state);
  return state;
}

}  // namespace

TEST_CASE("The shadow CQ grows by one entry per QP for the drain markers", "[engine]") {
  Rig rig;
  g_resized.clear();
  rig.e->verbs.resize_cq = fake_resize_cq;
  rig.shadow_cq.cqe = rig.cq.cqe;  // as ensure_shadow made it: the application's size
  vf::failover::reserve_shadow_entries(*rig.e, *rig.cq_state, 1);
  vf::failover::reserve_shadow_entries(*rig.e, *rig.cq_state, 1);
  CHECK(rig.shadow_cq.cqe == rig.cq.cqe + 2);
  CHECK(g_resized == std::vector<int>{rig.cq.cqe + 1, rig.cq.cqe + 2});
}

TEST_CASE("A shadow CQ that overran sends its QPs back to their primaries for good",
          "[engine]") {
  Rig rig;
  vf::CqState* state = register_cq(rig);
  rig.fail_over_and_rearm();
  rig.e->verbs.get_async_event = fake_get_async_event;
  rig.e->verbs.ack_async_event = fake_ack_async_event;
  g_error_cq = &rig.shadow_cq;
  vf::failover::on_device_event(*rig.e, 1);
  CHECK(state->shadow_failed);
  // The switch back to the primary began (the peer answers it; the rig's peer is in-process).
  CHECK(rig.p->sw.in_progress);
  CHECK(rig.p->sw.to == vf::kPrimary);
  CHECK(rig.p->unprotected_reason.find("overran") != std::string::npos);
  // Its standby is never re-armed nor switched to again.
  rig.p->sw = {};
  rig.v->set_active_path(vf::kPrimary);
  rig.v->path[vf::kStandby].failed = false;
  rig.v->path[vf::kStandby].connected = true;
  CHECK_FALSE(vf::failover::can_switch_to(*rig.p, vf::kStandby));
  rig.p->rearm[vf::kStandby].needed = true;
  g_modifies.clear();
  vf::failover::periodic_work(*rig.e);
  for (const ModifyCall& call : g_modifies) CHECK(call.qp != &rig.standby_qp);
}

TEST_CASE("A CQ_ERR of a CQ that is no shadow changes nothing", "[engine]") {
  Rig rig;
  vf::CqState* state = register_cq(rig);
  rig.e->verbs.get_async_event = fake_get_async_event;
  rig.e->verbs.ack_async_event = fake_ack_async_event;
  ibv_cq other{};
  g_error_cq = &other;
  vf::failover::on_device_event(*rig.e, 1);
  CHECK_FALSE(state->shadow_failed);
  CHECK(vf::failover::can_switch_to(*rig.p, vf::kStandby));
  CHECK(rig.p->unprotected_reason.empty());
}

// Review of a956981, finding 1: the peer must learn that this end's standby is lost, or it
// re-arms it and switches the pair there later.
TEST_CASE("A shadow CQ that overran under a QP on its primary ends the pair, and the peer is told",
          "[engine]") {
  Rig rig;
  vf::CqState* state = register_cq(rig);
  rig.e->verbs.get_async_event = fake_get_async_event;
  rig.e->verbs.ack_async_event = fake_ack_async_event;
  g_error_cq = &rig.shadow_cq;
  vf::failover::on_device_event(*rig.e, 1);
  CHECK(state->shadow_failed);
  CHECK(rig.p->ended);
  CHECK(rig.sent<vf::PairEnded>().size() == 1);
  CHECK(rig.v->active_path() == vf::kPrimary);
  // The peer's switch to the standby, had it missed the notice, is answered the same way.
  rig.deliver(rig.request_from_peer(1));
  CHECK(rig.v->active_path() == vf::kPrimary);
  CHECK_FALSE(rig.p->sw.in_progress);
}
