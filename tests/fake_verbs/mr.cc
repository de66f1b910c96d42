// FAKE libibverbs (verbs-failover test double) — protection domains and memory regions.
// An MR records where its bytes are (host address), what remote peers call them (iova) and its
// access flags; the datapath checks every lkey/rkey, bound and access bit against it. lkey == rkey,
// allocated from a global counter so a key from one PD/device never validates on another.
// ibv_rereg_mr always hands out a NEW key (the old one stops validating at once), so a caller
// that keeps using a stale key is caught.
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

// Remote write/atomic without local write is rejected by real devices (ib_check_mr_access).
bool access_is_valid(unsigned access) {
  return !((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
           !(access & IBV_ACCESS_LOCAL_WRITE));
}

ibv_mr* register_region(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, unsigned access) {
  if (!access_is_valid(access)) {
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

// ibv_rereg_mr, with rdma-core's return contract (enum ibv_rereg_mr_err_code, errno set):
//  - what libibverbs itself checks before asking the kernel -> IBV_REREG_MR_ERR_INPUT, EINVAL:
//    flags outside IBV_REREG_MR_FLAGS_SUPPORTED; CHANGE_TRANSLATION with a NULL addr or length 0;
//    access != 0 without CHANGE_ACCESS;
//  - what the kernel refuses ("command error") -> IBV_REREG_MR_ERR_CMD, errno EINVAL: flags == 0,
//    CHANGE_PD to NULL or to a PD of another context, CHANGE_ACCESS with remote write/atomic but
//    no local write, CHANGE_TRANSLATION longer than max_mr_size.
// On any failure the MR is left exactly as it was and stays usable (the kernel validates before
// touching it; rdma-core's man page only says the MR "shouldn't be used" after ERR_CMD).
// On success: CHANGE_TRANSLATION moves the MR to [addr, addr + length) with iova = addr (as
// ibv_cmd_rereg_mr passes it), CHANGE_PD moves it to the new PD (PD references follow),
// CHANGE_ACCESS replaces the access flags (optional-range bits dropped, as ibv_reg_mr_iova2
// does). Whatever the flags, the MR gets a NEW lkey == rkey and the old key no longer validates
// anywhere — real providers may keep or change the keys; changing them always makes a stale key
// visible (LOC_PROT_ERR / REM_ACCESS_ERR). mr->handle stays (same kernel object). WRs already
// posted with the old key fail when they execute, as they would on a device that changed it.
FAKE_EXPORT int ibv_rereg_mr(ibv_mr* ibmr, int flags, ibv_pd* ibpd, void* addr, size_t length,
                             int access) {
  if ((flags & ~int(IBV_REREG_MR_FLAGS_SUPPORTED)) != 0 ||
      ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr == nullptr || length == 0)) ||
      (access != 0 && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  auto lock = fabric_lock();
  Mr* mr = to_mr(ibmr);
  Pd* new_pd = mr->pd;
  unsigned new_access = unsigned(mr->access);
  bool ok = flags != 0;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    ok = ok && ibpd != nullptr && ibpd->context == ibmr->context;
    if (ibpd != nullptr) new_pd = to_pd(ibpd);
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    new_access = unsigned(access) & ~unsigned(IBV_ACCESS_OPTIONAL_RANGE);
    ok = ok && access_is_valid(new_access);
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ok = ok && length <= kMaxMrSize;
  if (!ok) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_CMD;
  }
  const uint32_t old_key = ibmr->lkey;
  unregister_mr_locked(mr);
  if (new_pd != mr->pd) {
    --mr->pd->refs;
    ++new_pd->refs;
    mr->pd = new_pd;
    ibmr->pd = ibpd;
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->host_addr = static_cast<uint8_t*>(addr);
    mr->iova = reinterpret_cast<uintptr_t>(addr);
    mr->length = length;
    ibmr->addr = addr;
    ibmr->length = length;
  }
  mr->access = int(new_access);
  ibmr->lkey = ibmr->rkey = fabric().next_key++;
  register_mr_locked(mr);
  fake_log("ibv_rereg_mr flags=%#x: key %#x -> %#x", unsigned(flags), old_key, ibmr->lkey);
  return 0;
}
