// Protection domains and memory registrations.
#include <infiniband/verbs.h>

#include "core/failover_engine.h"
#include "shim/export.h"
#include "shim/real_verbs.h"
#include "shim/trace.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using vf::shim::describe_context;
using vf::shim::intercept;
using vf::shim::real_verbs;

namespace {
std::string describe_mr(const ibv_mr* mr) {
  if (mr == nullptr) return "mr=NULL";
  return fmt::format("mr={}(lkey={:#x} rkey={:#x})", fmt::ptr(mr), mr->lkey, mr->rkey);
}
// A registration the application got is mirrored on the backup device's shadow PD.
ibv_mr* mirrored(ibv_mr* mr, void* addr, size_t length, uint64_t iova, unsigned int access,
                 int dmabuf_fd = -1, uint64_t dmabuf_offset = 0) {
  if (mr != nullptr && vf::shim::shim_active()) {
    const int saved = errno;
    vf::FailoverEngine::instance().on_mr_registered(mr, addr, length, iova, access, dmabuf_fd,
                                                    dmabuf_offset);
    errno = saved;
  }
  return mr;
}
}  // namespace

VF_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  return intercept("ibv_alloc_pd", VF_ARGS("{}", describe_context(context)),
                   [&] { return real_verbs().ibv_alloc_pd(context); });
}

VF_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  return intercept("ibv_dealloc_pd", VF_ARGS("pd={}", fmt::ptr(pd)),
                   [&] {
                     const int result = real_verbs().ibv_dealloc_pd(pd);
                     if (result == 0 && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_pd_destroy(pd);
                     }
                     return result;
                   });
}

VF_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return intercept(
      "ibv_reg_mr",
      VF_ARGS("pd={} addr={} len={} access={:#x}", fmt::ptr(pd), addr, length, access),
      [&] {
        return mirrored(real_verbs().ibv_reg_mr(pd, addr, length, access), addr, length,
                        reinterpret_cast<std::uintptr_t>(addr), static_cast<unsigned>(access));
      });
}

VF_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                  int access) {
  if (real_verbs().ibv_reg_mr_iova == nullptr) {
    return vf::shim::unsupported_verb<ibv_mr*>("ibv_reg_mr_iova");
  }
  return intercept("ibv_reg_mr_iova",
                   VF_ARGS("pd={} addr={} len={} iova={:#x} access={:#x}", fmt::ptr(pd), addr,
                           length, iova, access),
                   [&] {
                     return mirrored(real_verbs().ibv_reg_mr_iova(pd, addr, length, iova, access),
                                     addr, length, iova, static_cast<unsigned>(access));
                   });
}

VF_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                   unsigned int access) {
  if (real_verbs().ibv_reg_mr_iova2 == nullptr) {
    // libibverbs < v29: NCCL finds the shim's export and calls it, so serve what the old library
    // can (optional access bits are hints, dropping them is what libibverbs itself does).
    if (iova != reinterpret_cast<uintptr_t>(addr)) {
      return vf::shim::unsupported_verb<ibv_mr*>("ibv_reg_mr_iova2");
    }
    return ibv_reg_mr(pd, addr, length, static_cast<int>(access & ~IBV_ACCESS_OPTIONAL_RANGE));
  }
  return intercept("ibv_reg_mr_iova2",
                   VF_ARGS("pd={} addr={} len={} iova={:#x} access={:#x}", fmt::ptr(pd), addr,
                           length, iova, access),
                   [&] {
                     return mirrored(real_verbs().ibv_reg_mr_iova2(pd, addr, length, iova, access),
                                     addr, length, iova, access);
                   });
}

VF_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                                    int fd, int access) {
  if (real_verbs().ibv_reg_dmabuf_mr == nullptr) {
    return vf::shim::unsupported_verb<ibv_mr*>("ibv_reg_dmabuf_mr");
  }
  return intercept(
      "ibv_reg_dmabuf_mr",
      VF_ARGS("pd={} offset={:#x} len={} iova={:#x} fd={} access={:#x}", fmt::ptr(pd), offset,
              length, iova, fd, access),
      [&] {
        return mirrored(real_verbs().ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access),
                        nullptr, length, iova, static_cast<unsigned>(access), fd, offset);
      });
}

VF_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length,
                           int access) {
  return intercept("ibv_rereg_mr",
                   VF_ARGS("{} flags={:#x} pd={} addr={} len={} access={:#x}", describe_mr(mr),
                           flags, fmt::ptr(pd), addr, length, access),
                   [&] {
                     const std::uint32_t old_lkey = mr != nullptr ? mr->lkey : 0;
                     const std::uint32_t old_rkey = mr != nullptr ? mr->rkey : 0;
                     const int result = real_verbs().ibv_rereg_mr(mr, flags, pd, addr, length,
                                                                  access);
                     if (result == 0 && vf::shim::shim_active()) {
                       vf::FailoverEngine::instance().on_mr_reregistered(mr, flags, old_lkey,
                                                                         old_rkey, access);
                     }
                     return result;
                   });
}

VF_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  return intercept("ibv_dereg_mr", VF_ARGS("{}", describe_mr(mr)),
                   [&] {
                     if (vf::shim::shim_active()) vf::FailoverEngine::instance().on_mr_deregister(mr);
                     return real_verbs().ibv_dereg_mr(mr);
                   });
}

VF_EXPORT ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  if (real_verbs().ibv_import_pd == nullptr) {
    return vf::shim::unsupported_verb<ibv_pd*>("ibv_import_pd");
  }
  return intercept("ibv_import_pd",
                   VF_ARGS("{} handle={}", describe_context(context), pd_handle),
                   [&] { return real_verbs().ibv_import_pd(context, pd_handle); });
}

VF_EXPORT void ibv_unimport_pd(ibv_pd* pd) {
  if (real_verbs().ibv_unimport_pd == nullptr) return;
  intercept("ibv_unimport_pd", VF_ARGS("pd={}", fmt::ptr(pd)),
            [&] { real_verbs().ibv_unimport_pd(pd); });
}

VF_EXPORT ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (real_verbs().ibv_import_mr == nullptr) {
    return vf::shim::unsupported_verb<ibv_mr*>("ibv_import_mr");
  }
  return intercept("ibv_import_mr", VF_ARGS("pd={} handle={}", fmt::ptr(pd), mr_handle),
                   [&] { return real_verbs().ibv_import_mr(pd, mr_handle); });
}

VF_EXPORT void ibv_unimport_mr(ibv_mr* mr) {
  if (real_verbs().ibv_unimport_mr == nullptr) return;
  intercept("ibv_unimport_mr", VF_ARGS("{}", describe_mr(mr)),
            [&] { real_verbs().ibv_unimport_mr(mr); });
}
