// FAKE libibverbs (verbs-failover test double) — device enumeration and device/port/GID queries.
// Devices are fake0..fakeN-1 (VF_FAKE_VERBS_DEVICES, default 4): fake0/fake1 are "host A" rails
// 0/1, fake2/fake3 "host B" rails 0/1, and so on in pairs.
#include <arpa/inet.h>
#include <endian.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "internal.h"

using namespace fake_verbs;

#undef ibv_get_device_list
#undef ibv_query_port

FAKE_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  auto lock = fabric_lock();
  auto& devs = fabric().devices;
  auto** list = static_cast<ibv_device**>(std::calloc(devs.size() + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); ++i) list[i] = &devs[i]->shell.dev;
  if (num_devices != nullptr) *num_devices = int(devs.size());
  return list;
}

// Devices themselves live for the whole process (as in rdma-core); only the array is freed.
FAKE_EXPORT void ibv_free_device_list(ibv_device** list) {
  std::free(list);
}

FAKE_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return device->name;
}

FAKE_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  auto lock = fabric_lock();
  return htobe64(to_device(device)->guid_host_order);
}

FAKE_EXPORT int ibv_get_device_index(ibv_device* device) {
  auto lock = fabric_lock();
  return to_device(device)->index;
}

namespace fake_verbs {

static void fill_device_attr(Device* d, ibv_device_attr* a) {
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "fake-verbs-1.0");
  a->node_guid = htobe64(d->guid_host_order);
  a->sys_image_guid = htobe64(d->guid_host_order & ~0xffull);
  a->max_mr_size = kMaxMrSize;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = 0xfa4e;  // not a real PCI vendor
  a->vendor_part_id = 1;
  a->hw_ver = 1;
  a->max_qp = 1 << 16;
  a->max_qp_wr = kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
                        IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_CURR_QP_STATE_MOD;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = 1 << 16;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_res_rd_atom = 16 << 16;
  a->max_qp_init_rd_atom = 16;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_ah = 1 << 16;
  a->max_srq = 1 << 16;
  a->max_srq_wr = kMaxSrqWr;
  a->max_srq_sge = kMaxSge;
  a->max_pkeys = 1;
  a->phys_port_cnt = 1;
}

int query_device_ex_op(ibv_context* ctx, const ibv_query_device_ex_input* input,
                       ibv_device_attr_ex* attr, size_t attr_size) {
  if (input != nullptr && input->comp_mask != 0) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  auto lock = fabric_lock();
  ibv_device_attr_ex full{};
  fill_device_attr(to_ctx(ctx)->device, &full.orig_attr);
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
  full.max_dm_size = 0;
  std::memcpy(attr, &full, attr_size < sizeof full ? attr_size : sizeof full);
  return 0;
}

static void fill_port_attr(Device* d, ibv_port_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->state = d->port_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_1024;  // like RoCE on a 1500-byte Ethernet MTU
  a->gid_tbl_len = kGidTableLen;
  a->port_cap_flags = IBV_PORT_CM_SUP;
  a->max_msg_sz = kMaxMsgSize;
  a->pkey_tbl_len = 1;
  a->lid = 0;  // Ethernet link layer: no LIDs
  a->max_vl_num = 1;
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // EDR-ish; irrelevant for the fake
  a->phys_state = d->port_up ? 5 /* LinkUp */ : 3 /* Disabled */;
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

int query_port_op(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (port != 1) return EINVAL;
  auto lock = fabric_lock();
  ibv_port_attr full;
  fill_port_attr(to_ctx(ctx)->device, &full);
  std::memcpy(attr, &full, attr_len < sizeof full ? attr_len : sizeof full);
  return 0;
}

}  // namespace fake_verbs

FAKE_EXPORT int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  auto lock = fabric_lock();
  fill_device_attr(to_ctx(ctx)->device, attr);
  return 0;
}

// The exported symbol has rdma-core's compat signature; the inline ibv_query_port() in verbs.h
// goes through verbs_context::query_port instead. The old struct ends before 'flags'.
FAKE_EXPORT int ibv_query_port(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* attr) {
  return query_port_op(ctx, port, reinterpret_cast<ibv_port_attr*>(attr),
                       offsetof(ibv_port_attr, flags));
}

FAKE_EXPORT int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || index >= kGidTableLen) return -1;
  auto lock = fabric_lock();
  *gid = to_ctx(ctx)->device->gids[index];
  return 0;
}

FAKE_EXPORT int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index,
                                  ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (flags != 0) return EINVAL;
  if (port != 1 || index >= uint32_t(kGidTableLen)) return EINVAL;  // as the kernel's ioctl
  if (entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  auto lock = fabric_lock();
  // An empty slot is ENODATA (the kernel's answer); ibv_query_gid gives zeros for it instead.
  if (gid_is_empty(to_ctx(ctx)->device->gids[index])) return ENODATA;
  std::memset(entry, 0, entry_size);
  entry->gid = to_ctx(ctx)->device->gids[index];
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  entry->ndev_ifindex = 0;  // no netdev behind a fake NIC
  return 0;
}

FAKE_EXPORT ssize_t _ibv_query_gid_table(ibv_context* ctx, ibv_gid_entry* entries,
                                         size_t max_entries, uint32_t flags, size_t entry_size) {
  if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  if (max_entries < size_t(kGidTableLen)) return -EINVAL;
  // The valid entries only, each with its own index (as rdma-core's: a table with a hole has
  // entries whose gid_index is not their position).
  ssize_t valid = 0;
  for (int i = 0; i < kGidTableLen; ++i) {
    auto* e =
        reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + valid * entry_size);
    if (_ibv_query_gid_ex(ctx, 1, uint32_t(i), e, 0, entry_size) == 0) ++valid;
  }
  return valid;
}

FAKE_EXPORT int ibv_query_pkey(ibv_context*, uint8_t port, int index, __be16* pkey) {
  if (port != 1 || index != 0) return -1;
  *pkey = htons(0xffff);
  return 0;
}

FAKE_EXPORT int ibv_get_pkey_index(ibv_context*, uint8_t port, __be16 pkey) {
  if (port != 1 || ntohs(pkey) != 0xffff) return -1;
  return 0;
}
