#include "verbs_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "failure.h"

namespace nccl_pattern {
namespace {

void* open_library(std::string& chosen) {
  const char* env = std::getenv("NCCL_IBVERBS_LIB");
  const char* candidates[] = {env != nullptr && env[0] != '\0' ? env : nullptr, "libibverbs.so",
                              "libibverbs.so.1"};
  for (const char* name : candidates) {
    if (name == nullptr) continue;
    if (void* handle = dlopen(name, RTLD_NOW)) {
      chosen = name;
      return handle;
    }
  }
  fail(std::string("cannot dlopen libibverbs (tried $NCCL_IBVERBS_LIB, libibverbs.so, libibverbs.so.1): ") +
       dlerror());
}

template <typename Fn>
void resolve(void* handle, Fn& slot, const char* name, const char* version, bool required) {
  slot = reinterpret_cast<Fn>(dlvsym(handle, name, version));
  if (slot == nullptr && required) fail(std::string("dlvsym(") + name + ", " + version + ") failed");
}

VerbsApi load() {
  VerbsApi api;
  api.handle = open_library(api.library);
  void* h = api.handle;
  const char* v11 = "IBVERBS_1.1";
  resolve(h, api.get_device_list, "ibv_get_device_list", v11, true);
  resolve(h, api.free_device_list, "ibv_free_device_list", v11, true);
  resolve(h, api.get_device_name, "ibv_get_device_name", v11, true);
  resolve(h, api.open_device, "ibv_open_device", v11, true);
  resolve(h, api.close_device, "ibv_close_device", v11, true);
  resolve(h, api.get_async_event, "ibv_get_async_event", v11, true);
  resolve(h, api.ack_async_event, "ibv_ack_async_event", v11, true);
  resolve(h, api.event_type_str, "ibv_event_type_str", v11, true);
  resolve(h, api.query_device, "ibv_query_device", v11, true);
  resolve(h, api.query_port, "ibv_query_port", v11, true);
  resolve(h, api.query_gid, "ibv_query_gid", v11, true);
  resolve(h, api.query_qp, "ibv_query_qp", v11, true);
  resolve(h, api.alloc_pd, "ibv_alloc_pd", v11, true);
  resolve(h, api.dealloc_pd, "ibv_dealloc_pd", v11, true);
  resolve(h, api.reg_mr, "ibv_reg_mr", v11, true);
  resolve(h, api.dereg_mr, "ibv_dereg_mr", v11, true);
  resolve(h, api.create_cq, "ibv_create_cq", v11, true);
  resolve(h, api.destroy_cq, "ibv_destroy_cq", v11, true);
  resolve(h, api.create_qp, "ibv_create_qp", v11, true);
  resolve(h, api.modify_qp, "ibv_modify_qp", v11, true);
  resolve(h, api.destroy_qp, "ibv_destroy_qp", v11, true);
  resolve(h, api.fork_init, "ibv_fork_init", v11, true);
  resolve(h, api.reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", false);
  resolve(h, api.query_ece, "ibv_query_ece", "IBVERBS_1.10", false);
  resolve(h, api.set_ece, "ibv_set_ece", "IBVERBS_1.10", false);
  resolve(h, api.wc_status_str, "ibv_wc_status_str", v11, false);
  return api;
}

}  // namespace

ibv_mr* VerbsApi::register_memory(ibv_pd* pd, void* addr, size_t length, int access) const {
  // NCCL prefers ibv_reg_mr_iova2 (iova = the virtual address) when the library has it.
  if (reg_mr_iova2 != nullptr)
    return reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
  return reg_mr(pd, addr, length, access);
}

std::string VerbsApi::status_name(ibv_wc_status status) const {
  std::string text = std::to_string(static_cast<int>(status));
  if (wc_status_str != nullptr) text += std::string(" (") + wc_status_str(status) + ")";
  return text;
}

const VerbsApi& verbs() {
  // Loaded under a once-flag: the rank threads of single-process mode all call this.
  static std::once_flag once;
  static VerbsApi api;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const WorkloadError& e) {
      error = e.what();
    }
  });
  if (!error.empty()) fail(error);
  return api;
}

}  // namespace nccl_pattern
