#include "rdma_setup.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "failure.h"
#include "verbs_api.h"

namespace nccl_pattern {
namespace {

constexpr uint8_t kPort = 1;
constexpr int kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

std::string errno_text(int rc) {
  const int err = rc > 0 ? rc : errno;
  return std::string(std::strerror(err)) + " (" + std::to_string(err) + ")";
}

}  // namespace

Device::Device(const std::string& device_name, int gid, int rank) : name(device_name), gid_index(gid) {
  const VerbsApi& api = verbs();
  int count = 0;
  ibv_device** list = api.get_device_list(&count);
  if (list == nullptr) fail("ibv_get_device_list failed: " + errno_text(0));
  std::string seen;
  for (int i = 0; i < count && context == nullptr; ++i) {
    const std::string this_name = api.get_device_name(list[i]);
    seen += " " + this_name;
    if (this_name == name) {
      context = api.open_device(list[i]);
      index = i;
    }
  }
  api.free_device_list(list);
  if (context == nullptr) fail("device " + name + " not found or not opened (devices:" + seen + ")");
  pd = api.alloc_pd(context);
  if (pd == nullptr) fail("ibv_alloc_pd on " + name + " failed: " + errno_text(0));
  if (const int rc = api.query_port(context, kPort, &port); rc != 0)
    fail("ibv_query_port on " + name + " failed: " + errno_text(rc));
  if (port.state != IBV_PORT_ACTIVE) fail("port 1 of " + name + " is not ACTIVE");
  if (const int rc = api.query_gid(context, kPort, gid_index, &this->gid); rc != 0)
    fail("ibv_query_gid(" + name + ", index " + std::to_string(gid_index) + ") failed: " + errno_text(rc));
  events_ = std::make_unique<AsyncEventThread>(context, name, rank);
}

Device::~Device() {
  events_.reset();  // the thread reads the context: stop it first
  const VerbsApi& api = verbs();
  if (pd != nullptr) api.dealloc_pd(pd);
  if (context != nullptr) api.close_device(context);
}

MemoryRegion::MemoryRegion(Device& device, void* addr, size_t length) {
  mr = verbs().register_memory(device.pd, addr, length, kAccess);
  if (mr == nullptr) fail("memory registration on " + device.name + " failed: " + errno_text(0));
}

MemoryRegion::~MemoryRegion() {
  if (mr != nullptr) verbs().dereg_mr(mr);
}

QpGroup::QpGroup(Device& dev, int nqps) : device(dev) {
  const VerbsApi& api = verbs();
  cq = api.create_cq(device.context, kCqEntries, nullptr, nullptr, 0);
  if (cq == nullptr) fail("ibv_create_cq on " + device.name + " failed: " + errno_text(0));
  for (int q = 0; q < nqps; ++q) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;  // send and receive share one CQ, busy polled (no completion channel)
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = kQueueDepth;
    init.cap.max_recv_wr = kQueueDepth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = kInlineBytes;
    ibv_qp* qp = api.create_qp(device.pd, &init);
    if (qp == nullptr) fail("ibv_create_qp on " + device.name + " failed: " + errno_text(0));
    qps.push_back(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = kPort;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (const int rc = api.modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0)
      fail("ibv_modify_qp(INIT) on " + device.name + " failed: " + errno_text(rc));
  }
}

QpGroup::~QpGroup() {
  const VerbsApi& api = verbs();
  for (ibv_qp* qp : qps) api.destroy_qp(qp);
  if (cq != nullptr) api.destroy_cq(cq);
}

void QpGroup::describe(EndpointWire& wire) const {
  const VerbsApi& api = verbs();
  wire.magic = kWireMagic;
  wire.nqps = static_cast<uint32_t>(qps.size());
  wire.mtu = static_cast<uint32_t>(device.port.active_mtu);
  wire.lid = device.port.lid;
  std::memcpy(wire.gid, device.gid.raw, sizeof(wire.gid));
  for (size_t q = 0; q < qps.size(); ++q) {
    wire.qps[q].qpn = qps[q]->qp_num;
    // ECE: offered to the peer like NCCL does; a provider without ECE says EOPNOTSUPP.
    if (api.query_ece != nullptr) {
      const int rc = api.query_ece(qps[q], &wire.qps[q].ece);
      if (rc == 0) wire.qps[q].has_ece = 1;
      else if (rc != EOPNOTSUPP) fail("ibv_query_ece on " + device.name + " failed: " + errno_text(rc));
    }
  }
}

void QpGroup::connect(const EndpointWire& remote, int ib_timeout) {
  const VerbsApi& api = verbs();
  if (remote.magic != kWireMagic || remote.nqps != qps.size())
    fail("bootstrap: peer endpoint description does not match (magic/QP count)");
  for (size_t q = 0; q < qps.size(); ++q) {
    ibv_qp* qp = qps[q];
    const QpWire& peer = remote.qps[q];
    if (peer.has_ece != 0 && api.set_ece != nullptr) {
      ibv_ece ece = peer.ece;
      const int rc = api.set_ece(qp, &ece);
      if (rc != 0 && rc != EOPNOTSUPP) fail("ibv_set_ece on " + device.name + " failed: " + errno_text(rc));
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(remote.mtu, device.port.active_mtu));
    attr.dest_qp_num = peer.qpn;
    attr.rq_psn = 0;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.is_global = 1;  // RoCE needs the GRH; IB with a GRH works as well
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, sizeof(remote.gid));
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device.gid_index);
    attr.ah_attr.grh.hop_limit = 255;
    attr.ah_attr.dlid = static_cast<uint16_t>(remote.lid);
    attr.ah_attr.port_num = kPort;
    if (const int rc = api.modify_qp(qp, &attr,
                                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        rc != 0)
      fail("ibv_modify_qp(RTR) on " + device.name + " failed: " + errno_text(rc));
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = static_cast<uint8_t>(ib_timeout);
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = 0;
    attr.max_rd_atomic = 1;
    if (const int rc = api.modify_qp(qp, &attr,
                                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
        rc != 0)
      fail("ibv_modify_qp(RTS) on " + device.name + " failed: " + errno_text(rc));
  }
}

int QpGroup::index_of(uint32_t qpn) const {
  for (size_t q = 0; q < qps.size(); ++q)
    if (qps[q]->qp_num == qpn) return static_cast<int>(q);
  return -1;
}

}  // namespace nccl_pattern
