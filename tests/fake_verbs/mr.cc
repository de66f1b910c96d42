// FAKE libibverbs (verbs-failover test double) — protection domains and memory regions.
// An MR records where its bytes are (host address), what remote peers call them (iova) and its
// access flags; the datapath checks every lkey/rkey, bound and access bit against it. lkey == rkey,
// allocated from a global counter so a key from one PD/device never validates on another.
#include <cerrno>

#include "internal.h"

using namespace fake_verbs;

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

FAKE_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto lock = fabric_lock();
  auto* pd = new Pd();
  pd->ctx = to_ctx(context);
  ++pd->ctx->live_objects;
  pd->shell.impl = pd;
  pd->shell.pd.context = context;
  pd->shell.pd.handle = fabric().next_key++;
  return &pd->shell.pd;
}

FAKE_EXPORT int ibv_dealloc_pd(ibv_pd* ibpd) {
  auto lock = fabric_lock();
  Pd* pd = to_pd(ibpd);
  if (pd->refs != 0) return EBUSY;  // like the kernel: resources still hang off it
  --pd->ctx->live_objects;
  delete pd;
  return 0;
}

namespace {

ibv_mr* register_region(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, unsigned access) {
  // Remote write/atomic without local write is rejected by real devices.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  if (length > kMaxMrSize || (addr == nullptr && length != 0)) {
    errno = EINVAL;
    return nullptr;
  }
  auto lock = fabric_lock();
  auto* mr = new Mr();
  mr->shell.impl = mr;
  mr->pd = to_pd(ibpd);
  mr->host_addr = static_cast<uint8_t*>(addr);
  mr->iova = iova;
  mr->length = length;
  mr->access = int(access);
  ibv_mr& m = mr->shell.mr;
  m.context = ibpd->context;
  m.pd = ibpd;
  m.addr = addr;
  m.length = length;
  m.lkey = m.rkey = fabric().next_key++;
  m.handle = m.lkey;
  ++mr->pd->refs;
  register_mr_locked(mr);
  return &m;
}

}  // namespace

FAKE_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return register_region(pd, addr, length, reinterpret_cast<uintptr_t>(addr), unsigned(access));
}

FAKE_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                    int access) {
  return register_region(pd, addr, length, iova, unsigned(access));
}

// Optional-range access flags (relaxed ordering...) are accepted and ignored, as rdma-core does
// when the kernel lacks them.
FAKE_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                     unsigned int access) {
  return register_region(pd, addr, length, iova, access & ~unsigned(IBV_ACCESS_OPTIONAL_RANGE));
}

FAKE_EXPORT int ibv_dereg_mr(ibv_mr* ibmr) {
  auto lock = fabric_lock();
  Mr* mr = to_mr(ibmr);
  unregister_mr_locked(mr);
  --mr->pd->refs;
  delete mr;
  return 0;
}
