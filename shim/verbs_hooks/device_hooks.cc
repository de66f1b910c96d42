// Devices and contexts: listing, opening (where the shim takes over a context's function
// pointers), closing, and the query verbs.
#include <errno.h>
#include <infiniband/verbs.h>

#include <mutex>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/object_records.h"
#include "shim/port_monitor.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"
#include "shim/verbs_hooks/ops_hooks.h"

#undef ibv_query_port

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

namespace {
const char* device_name(const ibv_device* device) { return device != nullptr ? device->name : "NULL"; }

ibv_context* take_over_context(ibv_context* context) {
  if (context != nullptr && vf::shim::shim_active()) {
    {
      std::lock_guard lock(vf::shim::lifecycle_mutex());
      vf::shim::manage_context(context);
    }
    vf::shim::watch_ports_of(context->device);
    vf::FailoverEngine::instance().on_device_opened(context);
  }
  return context;
}
}  // namespace

VF_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  return intercept("ibv_get_device_list", VF_ARGS("num_devices={}", fmt::ptr(num_devices)),
                   [&]() -> ibv_device** {
                     // No libibverbs in the process (the shim stays idle, real_verbs.cc): what a
                     // probe for verbs gets is "no devices", never a call through a null pointer.
                     if (real_verbs().ibv_get_device_list == nullptr) {
                       if (num_devices != nullptr) *num_devices = 0;
                       errno = ENOSYS;
                       return nullptr;
                     }
                     return real_verbs().ibv_get_device_list(num_devices);
                   });
}

VF_EXPORT void ibv_free_device_list(ibv_device** list) {
  intercept("ibv_free_device_list", VF_ARGS("list={}", fmt::ptr(list)),
            [&] { real_verbs().ibv_free_device_list(list); });
}

VF_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return intercept("ibv_get_device_name", VF_ARGS("device={}", fmt::ptr(device)),
                   [&] { return real_verbs().ibv_get_device_name(device); });
}

VF_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  return intercept("ibv_get_device_guid", VF_ARGS("device={}", device_name(device)),
                   [&] { return real_verbs().ibv_get_device_guid(device); });
}

VF_EXPORT int ibv_get_device_index(ibv_device* device) {
  if (real_verbs().ibv_get_device_index == nullptr) return -1;  // libibverbs < v30: "unknown"
  return intercept("ibv_get_device_index", VF_ARGS("device={}", device_name(device)),
                   [&] { return real_verbs().ibv_get_device_index(device); });
}

VF_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  return intercept("ibv_open_device", VF_ARGS("device={}", device_name(device)),
                   [&] { return take_over_context(real_verbs().ibv_open_device(device)); });
}

VF_EXPORT ibv_context* ibv_import_device(int cmd_fd) {
  if (real_verbs().ibv_import_device == nullptr) {
    return vf::shim::unsupported_verb<ibv_context*>("ibv_import_device");
  }
  return intercept("ibv_import_device", VF_ARGS("cmd_fd={}", cmd_fd),
                   [&] { return take_over_context(real_verbs().ibv_import_device(cmd_fd)); });
}

VF_EXPORT int ibv_close_device(ibv_context* context) {
  return intercept("ibv_close_device", VF_ARGS("{}", describe_context(context)), [&] {
    if (!vf::shim::shim_active()) return real_verbs().ibv_close_device(context);
    std::lock_guard lock(vf::shim::lifecycle_mutex());
    const int result = real_verbs().ibv_close_device(context);
    if (result == 0) vf::shim::forget_context(context);
    return result;
  });
}

VF_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  return intercept("ibv_query_device", VF_ARGS("{}", describe_context(context)),
                   [&] { return real_verbs().ibv_query_device(context, attr); });
}

VF_EXPORT int ibv_query_port(ibv_context* context, uint8_t port_num,
                             struct _compat_ibv_port_attr* attr) {
  return intercept("ibv_query_port", VF_ARGS("{} port={}", describe_context(context), port_num),
                   [&] { return real_verbs().ibv_query_port(context, port_num, attr); });
}

VF_EXPORT int ibv_query_port_speed(ibv_context* context, uint32_t port_num, uint64_t* speed) {
  if (real_verbs().ibv_query_port_speed == nullptr) {
    return vf::shim::unsupported_verb<int>("ibv_query_port_speed");
  }
  return intercept("ibv_query_port_speed",
                   VF_ARGS("{} port={}", describe_context(context), port_num),
                   [&] { return real_verbs().ibv_query_port_speed(context, port_num, speed); });
}

VF_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  return intercept("ibv_query_gid",
                   VF_ARGS("{} port={} index={}", describe_context(context), port_num, index),
                   [&] { return real_verbs().ibv_query_gid(context, port_num, index, gid); });
}

VF_EXPORT int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                                ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (real_verbs()._ibv_query_gid_ex == nullptr) {
    return vf::shim::unsupported_verb<int>("ibv_query_gid_ex");
  }
  return intercept(
      "ibv_query_gid_ex",
      VF_ARGS("{} port={} index={}", describe_context(context), port_num, gid_index), [&] {
        return real_verbs()._ibv_query_gid_ex(context, port_num, gid_index, entry, flags,
                                              entry_size);
      });
}

VF_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries,
                                       size_t max_entries, uint32_t flags, size_t entry_size) {
  if (real_verbs()._ibv_query_gid_table == nullptr) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
  }
  return intercept(
      "ibv_query_gid_table", VF_ARGS("{} max={}", describe_context(context), max_entries), [&] {
        return real_verbs()._ibv_query_gid_table(context, entries, max_entries, flags, entry_size);
      });
}

VF_EXPORT int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  return intercept("ibv_query_pkey",
                   VF_ARGS("{} port={} index={}", describe_context(context), port_num, index),
                   [&] { return real_verbs().ibv_query_pkey(context, port_num, index, pkey); });
}

VF_EXPORT int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (real_verbs().ibv_get_pkey_index == nullptr) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return intercept("ibv_get_pkey_index",
                   VF_ARGS("{} port={} pkey={:#x}", describe_context(context), port_num, pkey),
                   [&] { return real_verbs().ibv_get_pkey_index(context, port_num, pkey); });
}

VF_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr,
                                          uint8_t eth_mac[6], uint16_t* vid) {
  return intercept(
      "ibv_resolve_eth_l2_from_gid", VF_ARGS("{}", describe_context(context)),
      [&] { return real_verbs().ibv_resolve_eth_l2_from_gid(context, attr, eth_mac, vid); });
}

VF_EXPORT int ibv_fork_init(void) {
  return intercept("ibv_fork_init", VF_ARGS(""), [&] {
    return real_verbs().ibv_fork_init != nullptr ? real_verbs().ibv_fork_init() : ENOSYS;
  });
}

VF_EXPORT const char* ibv_event_type_str(enum ibv_event_type event) {
  return intercept("ibv_event_type_str", VF_ARGS("event={}", static_cast<int>(event)),
                   [&] { return real_verbs().ibv_event_type_str(event); });
}

namespace vf::shim::ops {

int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) {
  const ContextRecord* record = context_records().find(context);
  if (record == nullptr) return EINVAL;
  return intercept("ibv_query_port(ex)",
                   VF_ARGS("{} port={}", describe_context(context), port_num),
                   [&] { return record->query_port(context, port_num, attr, attr_len); });
}

int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr, size_t attr_size) {
  const ContextRecord* record = context_records().find(context);
  if (record == nullptr) return EINVAL;
  return intercept("ibv_query_device_ex", VF_ARGS("{}", describe_context(context)),
                   [&] { return record->query_device_ex(context, input, attr, attr_size); });
}

}  // namespace vf::shim::ops
