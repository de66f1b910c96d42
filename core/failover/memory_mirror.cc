#include "core/failover/memory_mirror.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/failover/devices.h"
#include "core/log.h"
#include "core/verbs_names.h"

namespace vf::failover {

namespace {

std::uint64_t lkey_key(int device, std::uint32_t lkey) {
  return (static_cast<std::uint64_t>(device + 1) << 32) | lkey;
}

std::uint64_t rkey_key(std::uint64_t peer, std::uint32_t rkey) {
  return ((peer + 1) << 32) | rkey;
}

const void* key_of(std::uint64_t value) {
  return reinterpret_cast<const void*>(value);
}

}  // namespace

// ------------------------------------------------------------------ data-path services

bool translate_lkey(int device, std::uint32_t lkey, std::uint32_t* out) {
  const KeyTranslation* entry = datapath_registries::lkeys.find(key_of(lkey_key(device, lkey)));
  if (entry == nullptr) return false;
  *out = entry->value;
  return true;
}

bool translate_rkey(std::uint64_t peer, std::uint32_t rkey, std::uint32_t* out) {
  const KeyTranslation* entry = datapath_registries::rkeys.find(key_of(rkey_key(peer, rkey)));
  if (entry == nullptr) return false;
  *out = entry->value;
  return true;
}

namespace {

// Registry values are owned by key_storage (engine mutex held).
void put_key(Engine& e, KeyRegistry& registry, std::uint64_t key, std::uint32_t value) {
  auto& slot = e.key_storage[key ^ (&registry == &datapath_registries::rkeys ? (1ull << 63) : 0)];
  if (slot) {
    slot->value = value;
    return;
  }
  slot = std::make_unique<KeyTranslation>();
  slot->value = value;
  if (!registry.insert(key_of(key), slot.get())) {
    VF_LOG_WARN("key translation table full; a registration is not usable on the standby path");
  }
}

void erase_key(KeyRegistry& registry, std::uint64_t key) {
  registry.erase(key_of(key));
  // The value stays allocated: a data-path reader may hold it for a moment. Registrations are
  // few and long-lived, so the storage is reclaimed only when the key is reused.
}

bool mirror_mr(Engine& e, MrRecord& record, ibv_pd* app_pd, void* addr, std::size_t length,
               std::uint64_t iova, unsigned int access, int dmabuf_fd,
               std::uint64_t dmabuf_offset) {
  const int backup = e.devices[record.device].ports[1].backup_device;
  if (backup < 0) return false;
  ShadowPd* pd = shadow_pd_for(e, app_pd, backup);
  if (pd == nullptr) return false;
  if (dmabuf_fd >= 0) {
    record.shadow = e.verbs.reg_dmabuf_mr != nullptr
                        ? e.verbs.reg_dmabuf_mr(pd->shadow, dmabuf_offset, length, iova, dmabuf_fd,
                                                static_cast<int>(access))
                        : nullptr;
  } else {
    record.shadow = e.verbs.reg_mr_iova2(pd->shadow, addr, length, iova, access);
  }
  if (record.shadow == nullptr) {
    VF_LOG_WARN(
        "failover: mirroring a registration of {} bytes on {} failed ({}); QPs using it "
        "cannot be replayed there",
        length, e.devices[backup].name, strerror(errno));
    return false;
  }
  return true;
}

// One MrUpdate per (peer process, device) paired with a QP of this device.
void queue_mr_update(Engine& e, int device, const MrTranslation& translation) {
  std::vector<std::pair<std::uint64_t, Gid>> told;
  for (auto& [key, p] : e.protections) {
    if (p.destroyed || !p.paired || p.peer.local) continue;
    if (p.qp->path[kPrimary].device_index != device) continue;
    const auto who = std::make_pair(p.peer.token, p.local.gid);
    if (std::find(told.begin(), told.end(), who) != told.end()) continue;
    told.push_back(who);
    MrUpdate update;
    update.registrations.push_back(translation);
    update.device_gid = p.local.gid;
    e.outbox.emplace_back(p.qp.get(), update);
  }
}

// A mirrored registration's translations: this process's own tables, and its peers (those
// pairing later get the table in the pairing), from the engine's thread.
void publish_mirror(Engine& e, const MrRecord& record) {
  const ibv_mr* mr = record.app_mr;
  put_key(e, datapath_registries::lkeys, lkey_key(record.device, mr->lkey), record.shadow->lkey);
  // For QPs of this process connected to this device.
  put_key(e, datapath_registries::rkeys, rkey_key(local_peer_index(record.device), mr->rkey),
          record.shadow->rkey);
  queue_mr_update(e, record.device,
                  MrTranslation{reinterpret_cast<std::uintptr_t>(mr->addr), mr->length, mr->rkey,
                                record.shadow->rkey});
  wake_engine(e);
}

// The reverse, for the keys the registration had: translations withdrawn, the shadow gone.
void forget_mirror(Engine& e, MrRecord& record, std::uint32_t lkey, std::uint32_t rkey) {
  erase_key(datapath_registries::lkeys, lkey_key(record.device, lkey));
  queue_mr_update(e, record.device, MrTranslation{0, 0, rkey, 0});
  erase_key(datapath_registries::rkeys, rkey_key(local_peer_index(record.device), rkey));
  wake_engine(e);
  if (record.shadow != nullptr) e.verbs.dereg_mr(record.shadow);
  record.shadow = nullptr;
}

}  // namespace

std::uint32_t peer_index(Engine& e, std::uint64_t token, const Gid& device_gid) {
  auto [it, inserted] = e.peer_index_of.try_emplace(
      std::make_pair(token, device_gid), static_cast<std::uint32_t>(e.peer_index_of.size() + 1));
  return it->second;
}

std::uint32_t local_peer_index(int device) {
  return 0x100000u + static_cast<std::uint32_t>(device);
}

void learn_translations(Engine& e, std::uint64_t peer, const std::vector<MrTranslation>& list) {
  for (const MrTranslation& entry : list) {
    if (entry.length == 0) {
      erase_key(datapath_registries::rkeys, rkey_key(peer, entry.primary_rkey));
    } else {
      put_key(e, datapath_registries::rkeys, rkey_key(peer, entry.primary_rkey),
              entry.standby_rkey);
    }
  }
}

std::vector<MrTranslation> mirrored_registrations(
    Engine& e, std::size_t max, const std::function<bool(const ibv_mr&, const MrRecord&)>& wanted) {
  std::vector<MrTranslation> out;
  for (const auto& [mr, record] : e.mrs) {
    if (record->shadow == nullptr || !wanted(*mr, *record)) continue;
    if (out.size() >= max) break;
    out.push_back(
        {reinterpret_cast<std::uintptr_t>(mr->addr), mr->length, mr->rkey, record->shadow->rkey});
  }
  return out;
}

void handle_mr_update(Engine& e, const PeerRef& from, const MrUpdate& update) {
  if (!from.local)
    learn_translations(e, peer_index(e, from.token, update.device_gid), update.registrations);
}

void handle_mr_query(Engine& e, const PeerRef& from, std::uint64_t session, const MrQuery& query) {
  MrUpdate update;
  update.device_gid = query.device_gid;
  update.registrations = mirrored_registrations(
      e, std::numeric_limits<std::size_t>::max(), [&](const ibv_mr& mr, const MrRecord& record) {
        return mr.rkey == query.primary_rkey && gid_of_port(e, record.device, 1, query.device_gid);
      });
  if (!from.local) e.channel.send(session, update);
}

ShadowPd* shadow_pd_for(Engine& e, ibv_pd* app_pd, int backup_device) {
  auto key = std::make_pair(app_pd, backup_device);
  auto it = e.shadow_pds.find(key);
  if (it != e.shadow_pds.end()) return &it->second;
  ibv_pd* shadow = e.verbs.alloc_pd(e.devices[backup_device].context);
  if (shadow == nullptr) return nullptr;
  return &(e.shadow_pds[key] = ShadowPd{shadow, backup_device});
}

void pd_destroying(Engine& e, ibv_pd* pd) {
  for (auto it = e.shadow_pds.begin(); it != e.shadow_pds.end();) {
    if (it->first.first == pd) {
      e.verbs.dealloc_pd(it->second.shadow);
      it = e.shadow_pds.erase(it);
    } else {
      ++it;
    }
  }
}

void mr_registered(Engine& e, ibv_mr* mr, void* addr, std::size_t length, std::uint64_t iova,
                   unsigned int access, int dmabuf_fd, std::uint64_t dmabuf_offset) {
  if (!engine_running(e) || mr == nullptr) return;
  const int device = device_of_context(e, mr->context);
  if (device < 0 || e.devices[device].ports[1].backup_device < 0) return;
  auto record = std::make_unique<MrRecord>();
  record->app_mr = mr;
  record->device = device;
  record->iova = iova;
  record->access = access;
  record->dmabuf_fd = dmabuf_fd;
  record->dmabuf_offset = dmabuf_offset;
  if (!mirror_mr(e, *record, mr->pd, addr, length, iova, access, dmabuf_fd, dmabuf_offset)) return;
  publish_mirror(e, *record);
  e.mrs[mr] = std::move(record);
}

void mr_reregistered(Engine& e, ibv_mr* mr, int flags, std::uint32_t old_lkey,
                     std::uint32_t old_rkey, int access) {
  auto it = e.mrs.find(mr);
  if (it == e.mrs.end()) return;
  MrRecord& record = *it->second;
  // The old keys and the old mirror go (as for a deregistration)...
  forget_mirror(e, record, old_lkey, old_rkey);
  // ...and the registration as it is now is mirrored again: the provider updated the MR's
  // pd/addr/length; a new translation has no iova of its own (it is the address).
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) record.access = static_cast<unsigned int>(access);
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    record.iova = reinterpret_cast<std::uintptr_t>(mr->addr);
    if (record.dmabuf_fd >= 0) {
      VF_LOG_WARN(
          "failover: a dma-buf registration moved (ibv_rereg_mr); it is no longer "
          "mirrored, requests using it cannot be replayed on the standby");
      e.mrs.erase(it);
      return;
    }
  }
  if (!mirror_mr(e, record, mr->pd, mr->addr, mr->length, record.iova, record.access,
                 record.dmabuf_fd, record.dmabuf_offset)) {
    e.mrs.erase(it);
    return;
  }
  publish_mirror(e, record);
}

void mr_deregistering(Engine& e, ibv_mr* mr) {
  auto it = e.mrs.find(mr);
  if (it == e.mrs.end()) return;
  forget_mirror(e, *it->second, mr->lkey, mr->rkey);
  e.mrs.erase(it);
}

}  // namespace vf::failover
