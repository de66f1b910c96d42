#include "core/datapath_registries.h"

#include <type_traits>

namespace vf::datapath_registries {

// Constant-initialised and trivially destructible: usable before any constructor ran, never torn
// down under the engine's thread at exit.
static_assert(std::is_trivially_destructible_v<VirtualQpRegistry>);
static_assert(std::is_trivially_destructible_v<QpnRegistry>);
static_assert(std::is_trivially_destructible_v<CqRegistry>);
static_assert(std::is_trivially_destructible_v<SrqRegistry>);
static_assert(std::is_trivially_destructible_v<KeyRegistry>);
constinit VirtualQpRegistry qps_by_address;
constinit QpnRegistry qps_by_qpn;
constinit CqRegistry cqs_by_address;
constinit SrqRegistry srqs_by_address;
constinit KeyRegistry lkeys;
constinit KeyRegistry rkeys;

}  // namespace vf::datapath_registries
