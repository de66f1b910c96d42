// Verbs objects set up the way NCCL's IB transport sets them up (facts file, "NCCL's traffic"):
// RC QPs with one SGE each way, send and receive sharing one CQ, max_send_wr 512, NCCL's RTR/RTS
// attributes, ECE queried after creation and set from the peer's, memory registered with
// LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC (ibv_reg_mr_iova2 when present).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "async_events.h"

namespace nccl_pattern {

constexpr int kMaxQpsPerConn = 8;
constexpr int kQueueDepth = 512;  // NCCL's max_send_wr; also the receive queue
constexpr int kCqEntries = 4096;
constexpr int kInlineBytes = 64;  // clear-to-send entries are written inline, as NCCL does

// An opened device port: context, PD, port attributes, GID, and its async-event thread.
class Device {
 public:
  Device(const std::string& name, int gid_index, int rank);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  std::string name;
  int gid_index;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr port{};
  ibv_gid gid{};
  int index = -1;  // position in the device list (the fake's fault API takes it)

 private:
  std::unique_ptr<AsyncEventThread> events_;
};

class MemoryRegion {
 public:
  MemoryRegion(Device& device, void* addr, size_t length);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ibv_mr* mr = nullptr;
};

struct QpWire {
  uint32_t qpn = 0;
  uint32_t has_ece = 0;
  ibv_ece ece{};
};

// What one side of a connection tells the other over the bootstrap link.
struct EndpointWire {
  uint32_t magic = 0;
  uint32_t rank = 0;
  uint32_t nqps = 0;
  uint32_t mtu = 0;  // enum ibv_mtu
  uint8_t gid[16] = {};
  uint32_t lid = 0;
  uint32_t fifo_rkey = 0;  // sender side only: where the receiver writes clear-to-send entries
  uint64_t fifo_addr = 0;
  QpWire qps[kMaxQpsPerConn];
};
constexpr uint32_t kWireMagic = 0x4e43434c;  // "NCCL"

// A CQ and QPs on one device (one NCCL connection end, or the self-connected flush QP).
class QpGroup {
 public:
  QpGroup(Device& device, int nqps);
  ~QpGroup();
  QpGroup(const QpGroup&) = delete;
  QpGroup& operator=(const QpGroup&) = delete;

  void describe(EndpointWire& wire) const;  // QPNs, ECE, GID, LID, MTU
  // INIT -> RTR -> RTS against the remote end's QPs, pairwise by index.
  void connect(const EndpointWire& remote, int ib_timeout);
  int index_of(uint32_t qpn) const;  // -1 when no QP of this group has that number

  Device& device;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;
};

}  // namespace nccl_pattern
