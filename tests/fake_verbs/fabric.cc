// FAKE libibverbs (verbs-failover test double) — the in-process "fabric": the global lock, the
// fake devices, lookups across them, completion/event plumbing and the deterministic progress
// engine. See docs/fake_verbs.md for the model.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.h"

namespace fake_verbs {

Fabric& fabric() {
  static Fabric* instance = new Fabric();  // never destroyed: objects may outlive static dtors
  return *instance;
}

namespace {

void report(const char* prefix, const char* fmt, va_list ap) {
  std::fprintf(stderr, "[FAKE libibverbs] %s", prefix);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
}

}  // namespace

void fake_log(const char* fmt, ...) {
  if (!fabric().log) return;
  va_list ap;
  va_start(ap, fmt);
  report("", fmt, ap);
  va_end(ap);
}

void fake_fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report("FATAL: ", fmt, ap);
  va_end(ap);
  std::abort();
}

namespace {

int configured_device_count() {
  const char* env = std::getenv("VF_FAKE_VERBS_DEVICES");
  if (env == nullptr || *env == '\0') return 4;
  int n = std::atoi(env);
  if (n < 1) n = 1;
  if (n > 64) n = 64;
  return n;
}

void init_device(Device& d, int index) {
  d.index = index;
  d.host = index / 2;
  d.rail = index % 2;
  // Locally administered, recognisably fake GUID: 02:fa:4e (= "fake") + host + rail.
  d.guid_host_order = 0x02fa4e0000000000ull | (uint64_t(d.host) << 8) | uint64_t(d.rail);
  ibv_device& dev = d.shell.dev;
  d.shell.impl = &d;
  dev.node_type = IBV_NODE_CA;
  dev.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(dev.name, sizeof dev.name, "fake%d", index);
  std::snprintf(dev.dev_name, sizeof dev.dev_name, "fake_uverbs%d", index);
  // Paths that cannot exist, so nothing reads real sysfs by mistake.
  std::snprintf(dev.dev_path, sizeof dev.dev_path, "/nonexistent/fake_verbs/uverbs%d", index);
  std::snprintf(dev.ibdev_path, sizeof dev.ibdev_path, "/nonexistent/fake_verbs/fake%d", index);
  set_default_gids(d);
}

}  // namespace

void set_default_gids(Device& d) {
  for (ibv_gid& g : d.gids) g = ibv_gid{};
  // GID 0: link-local fe80::<EUI-64 from GUID>. GID 1: RoCEv2 IPv4-mapped
  // ::ffff:198.18.<rail+1>.<host+1> (198.18.0.0/15 is the benchmarking range, never a real address
  // here).
  ibv_gid& ll = d.gids[0];
  ll.raw[0] = 0xfe;
  ll.raw[1] = 0x80;
  for (int i = 0; i < 8; ++i) ll.raw[8 + i] = uint8_t(d.guid_host_order >> (56 - 8 * i));
  ibv_gid& v4 = d.gids[1];
  v4.raw[10] = 0xff;
  v4.raw[11] = 0xff;
  v4.raw[12] = 198;
  v4.raw[13] = 18;
  v4.raw[14] = uint8_t(d.rail + 1);
  v4.raw[15] = uint8_t(d.host + 1);
}

void ensure_initialized_locked() {
  Fabric& f = fabric();
  if (f.initialized) return;
  f.initialized = true;
  const char* log = std::getenv("VF_FAKE_VERBS_LOG");
  f.log = log != nullptr && *log != '\0' && std::strcmp(log, "0") != 0;
  int n = configured_device_count();
  const char* wire_name = std::getenv("VF_FAKE_VERBS_WIRE");
  if (wire_name != nullptr && *wire_name != '\0') {
    const char* host = std::getenv("VF_FAKE_VERBS_HOST");
    char* end = nullptr;
    const long h = host != nullptr ? std::strtol(host, &end, 10) : -1;
    if (host == nullptr || *host == '\0' || *end != '\0' || h < 0 || 2 * h + 1 >= n)
      fake_fatal("VF_FAKE_VERBS_WIRE is set: VF_FAKE_VERBS_HOST must name this process's host, "
                 "0..%d (VF_FAKE_VERBS_DEVICES=%d), not '%s'",
                 n / 2 - 1, n, host != nullptr ? host : "(unset)");
    f.wire = true;
    f.wire_host = int(h);
    f.wire_name = wire_name;
    // QP numbers stay unique across the fabric: each host numbers from its own base.
    f.next_qp_num = 0x11 + uint32_t(h) * 0x10000;
  }
  for (int i = 0; i < n; ++i) {
    if (f.wire && i / 2 != f.wire_host) continue;  // another process's NIC
    auto d = std::make_unique<Device>();
    init_device(*d, i);
    f.devices.push_back(std::move(d));
  }
  fake_log(
      "this is the FAKE libibverbs of verbs-failover (tests only): %zu fake devices from fake%d",
      f.devices.size(), f.devices.front()->index);
  if (f.wire) wire_start_locked();
}

std::unique_lock<std::mutex> fabric_lock() {
  std::unique_lock<std::mutex> lock(fabric().mutex);
  ensure_initialized_locked();
  return lock;
}

Device* find_device_by_gid_locked(const ibv_gid& gid) {
  if (gid_is_empty(gid)) return nullptr;  // no address: it matches no device's empty slot
  for (auto& d : fabric().devices)
    for (const ibv_gid& g : d->gids)
      if (std::memcmp(g.raw, gid.raw, sizeof g.raw) == 0) return d.get();
  return nullptr;
}

bool gid_is_empty(const ibv_gid& gid) {
  static const ibv_gid kEmpty{};
  return std::memcmp(gid.raw, kEmpty.raw, sizeof gid.raw) == 0;
}

const ibv_gid& source_gid_locked(const Qp* qp) {
  return qp->av_sgid;
}

bool addressed_to_locked(const Qp* qp, const ibv_gid& src, const ibv_gid& dst) {
  return std::memcmp(dst.raw, source_gid_locked(qp).raw, sizeof dst.raw) == 0 &&
         std::memcmp(src.raw, qp->attr.ah_attr.grh.dgid.raw, sizeof src.raw) == 0;
}

Qp* find_qp_locked(Device* dev, uint32_t qp_num) {
  for (Qp* qp : fabric().qps)
    if (qp->ctx->device == dev && qp->shell.qpx.qp_base.qp_num == qp_num) return qp;
  return nullptr;
}

void register_mr_locked(Mr* mr) {
  fabric().mrs[mr->shell.mr.lkey] = mr;
}
void unregister_mr_locked(Mr* mr) {
  fabric().mrs.erase(mr->shell.mr.lkey);
}

Mr* find_mr_by_lkey_locked(Pd* pd, uint32_t lkey) {
  auto it = fabric().mrs.find(lkey);
  if (it == fabric().mrs.end() || it->second->pd != pd) return nullptr;
  return it->second;
}

Mr* find_mr_by_rkey_locked(Pd* pd, uint32_t rkey) {
  return find_mr_by_lkey_locked(pd, rkey);
}

static void bump_eventfd(int fd) {
  uint64_t one = 1;
  // eventfd write of 1 cannot block in practice (counter never nears 2^64-1)
  ssize_t r = write(fd, &one, sizeof one);
  (void)r;
}

void raise_async_event_locked(Context* ctx, const ibv_async_event& ev) {
  ctx->async_events.push_back(ev);
  bump_eventfd(ctx->shell.vctx.context.async_fd);
  fake_log("async event %s on %s", ibv_event_type_str(ev.event_type), ctx->device->shell.dev.name);
}

void raise_device_event_locked(Device* dev, ibv_event_type type) {
  for (Context* ctx : dev->contexts) {
    ibv_async_event ev{};
    ev.event_type = type;
    ev.element.port_num = 1;
    raise_async_event_locked(ctx, ev);
  }
}

void push_completion_locked(Cq* cq, const ibv_wc& wc) {
  if (cq->overflowed) return;  // a broken CQ stays broken, like hardware
  if (int(cq->entries.size()) >= cq->capacity) {
    cq->overflowed = true;
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_CQ_ERR;
    ev.element.cq = cq->ibcq();
    raise_async_event_locked(cq->ctx, ev);
    return;
  }
  cq->entries.push_back(wc);
  // Internally, bit 31 of wc_flags marks a receive of a message sent with IBV_SEND_SOLICITED;
  // it decides whether a solicited-only arm fires and is cleared before the user sees it.
  bool wake = cq->armed && (!cq->armed_solicited_only || wc.status != IBV_WC_SUCCESS ||
                            (wc.wc_flags & (1u << 31)) != 0);
  cq->entries.back().wc_flags &= ~(1u << 31);
  if (wake) cq->armed = false;
  if (wake && cq->channel != nullptr) {
    cq->channel->events.push_back(cq);
    bump_eventfd(cq->channel->fd);
  }
}

}  // namespace fake_verbs
