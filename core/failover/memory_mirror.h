// Memory mirror and key translation: every registration of a protected device is registered again
// on its backup device (a shadow PD per application PD), the data path's lkey and rkey tables are
// filled (core/datapath_registries.h), and the peers learn our rkeys' standby values (in the
// pairing, then MrUpdate and MrQuery). Also the MR and PD entry points of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/failover/engine_state.h"

namespace vf::failover {

// Data-path services (DatapathServices): the standby's lkey of a registration of `device`, the
// peer's standby rkey of an rkey the application got from `peer`. Lock-free.
bool translate_lkey(int device, std::uint32_t lkey, std::uint32_t* out);
bool translate_rkey(std::uint64_t peer, std::uint32_t rkey, std::uint32_t* out);

// rkeys are per device: a translation table per (peer process, peer device), the device named
// by the GID its QPs carry. Peers inside this process have one table per local device.
std::uint32_t peer_index(Engine& e, std::uint64_t token, const Gid& device_gid);
std::uint32_t local_peer_index(int device);

// A peer's translations (its pairing message, an MrUpdate): a length of 0 withdraws one.
void learn_translations(Engine& e, std::uint64_t peer, const std::vector<MrTranslation>& list);

// The mirrored registrations `wanted` picks, as the peer needs them, at most `max`.
std::vector<MrTranslation> mirrored_registrations(
    Engine& e, std::size_t max, const std::function<bool(const ibv_mr&, const MrRecord&)>& wanted);

// MrUpdate: a peer's registrations changed. MrQuery: a peer misses the translation of one rkey
// of ours (its replay needs it); the answer is an MrUpdate.
void handle_mr_update(Engine& e, const PeerRef& from, const MrUpdate& update);
void handle_mr_query(Engine& e, const PeerRef& from, std::uint64_t session, const MrQuery& query);

// The application's PD on the backup device (created at first use).
ShadowPd* shadow_pd_for(Engine& e, ibv_pd* app_pd, int backup_device);

// Entry points (FailoverEngine, engine mutex held): before the provider deallocates a PD, after a
// registration, after an ibv_rereg_mr (its old keys given), before a deregistration.
void pd_destroying(Engine& e, ibv_pd* pd);
void mr_registered(Engine& e, ibv_mr* mr, void* addr, std::size_t length, std::uint64_t iova,
                   unsigned int access, int dmabuf_fd, std::uint64_t dmabuf_offset);
void mr_reregistered(Engine& e, ibv_mr* mr, int flags, std::uint32_t old_lkey,
                     std::uint32_t old_rkey, int access);
void mr_deregistering(Engine& e, ibv_mr* mr);

}  // namespace vf::failover
