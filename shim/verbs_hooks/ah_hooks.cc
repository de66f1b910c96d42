// Address handles.
#include <infiniband/verbs.h>

#include "shim/export.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

VF_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  return intercept("ibv_create_ah",
                   VF_ARGS("pd={} port={} is_global={}", fmt::ptr(pd),
                           attr ? attr->port_num : 0, attr ? attr->is_global : 0),
                   [&] { return real_verbs().ibv_create_ah(pd, attr); });
}

VF_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  return intercept("ibv_destroy_ah", VF_ARGS("ah={}", fmt::ptr(ah)),
                   [&] { return real_verbs().ibv_destroy_ah(ah); });
}

VF_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc,
                                  ibv_grh* grh, ibv_ah_attr* ah_attr) {
  return intercept(
      "ibv_init_ah_from_wc", VF_ARGS("{} port={}", describe_context(context), port_num),
      [&] { return real_verbs().ibv_init_ah_from_wc(context, port_num, wc, grh, ah_attr); });
}

VF_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  return intercept("ibv_create_ah_from_wc", VF_ARGS("pd={} port={}", fmt::ptr(pd), port_num),
                   [&] { return real_verbs().ibv_create_ah_from_wc(pd, wc, grh, port_num); });
}
