// FAKE libibverbs (verbs-failover test double) — the wire between processes.
//
// With VF_FAKE_VERBS_WIRE=<fabric name> and VF_FAKE_VERBS_HOST=<h>, a process is host h of a
// fabric shared by every process given the same name: it has only host h's devices (fake<2h>,
// fake<2h+1>), and a QP whose peer GID names another host's device reaches it here. Each device
// is a unix datagram socket in the abstract namespace (no file to clean up, and it vanishes with
// its process, so a dead peer is a silent one). A request is one datagram; the responder's process
// executes it (responder.cc) and answers with one datagram. Every progress step serves the wire
// (receives, answers, sends what waited for room), whichever thread runs it, so a program that
// spins in ibv_poll_cq never starves its NIC of the fabric lock; a thread of the fake runs a step
// on each datagram and every millisecond, as a NIC works while the program sleeps, so that retry
// timers fire.
//
// RC as the requester sees it: one request in flight per QP (stop-and-wait), PSNs from the
// QP's sq_psn (one per message), a try lost when no answer comes within the transport timeout
// of the QP's `timeout` attribute (4.096 us * 2^timeout, at least 1 ms; 0 = never), retry_cnt
// retries, then RETRY_EXC_ERR. The responder executes a request whose PSN it expects (rq_psn,
// then one more each), acknowledges a duplicate again without executing it (a READ's or atomic's
// recorded answer is resent), and ignores one from the future, as RC does.
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <new>
#include <thread>

#include "internal.h"

namespace fake_verbs {

namespace {

constexpr uint32_t kMagic = 0x56465752;  // "VFWR"
constexpr uint8_t kKindRequest = 1;
constexpr uint8_t kKindResponse = 2;
constexpr size_t kMaxQueued = 4096;   // datagrams waiting for room at a busy peer
constexpr size_t kRecentReplies = 16;  // READ/atomic answers kept for retries of them
constexpr uint32_t kPsnMask = 0xffffff;

struct Header {
  uint32_t magic;
  uint8_t kind;
  uint8_t response;
  uint8_t solicited;
  uint8_t opcode;
  int32_t src_dev;
  int32_t dst_dev;
  uint32_t src_qpn;
  uint32_t dst_qpn;
  uint32_t psn;
  uint32_t imm_data;
  uint32_t rkey;
  uint32_t length;  // request: Request::length; response: reply bytes that follow
  uint32_t payload_bytes;
  uint64_t remote_addr;
  uint64_t compare_add;
  uint64_t swap;
  uint8_t src_gid[16];  // the IP header's addresses: the sender's source GID now,
  uint8_t dst_gid[16];  // and the GID it sends to
};
static_assert(sizeof(Header) == 104, "the wire header is a fixed, padding-free layout");

ibv_gid gid_from(const uint8_t (&raw)[16]) {
  ibv_gid gid;
  std::memcpy(gid.raw, raw, sizeof gid.raw);
  return gid;
}

struct Wire {
  std::map<int, int> fds;  // this host's device index -> its socket
  std::deque<std::pair<int, std::vector<uint8_t>>> queued;  // (to device, datagram)
  std::vector<uint8_t> buffer = std::vector<uint8_t>(sizeof(Header) + kWireMaxPayload);
};

Wire& wire() {
  static Wire* instance = new Wire();  // never destroyed, like the fabric
  return *instance;
}

sockaddr_un address_of(int device_index, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: sun_path[0] == 0. Long fabric names are hashed to fit.
  const std::string& name = fabric().wire_name;
  std::string key = name.size() <= 64 ? name : std::to_string(std::hash<std::string>{}(name));
  int n = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "vf-fake-wire/%s/%d", key.c_str(),
                        device_index);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
  return a;
}

Device* local_device(int index) {
  for (auto& d : fabric().devices)
    if (d->index == index) return d.get();
  return nullptr;
}

// False when the datagram could not go and never will (no such peer): it is lost.
bool try_send(int from_fd, int to_index, const std::vector<uint8_t>& bytes, bool* busy) {
  socklen_t len = 0;
  sockaddr_un to = address_of(to_index, &len);
  *busy = false;
  if (sendto(from_fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
             reinterpret_cast<sockaddr*>(&to), len) >= 0) {
    return true;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
    *busy = true;
    return false;
  }
  fake_log("wire: fake%d is not there (%s): datagram lost", to_index, std::strerror(errno));
  return false;
}

int any_fd() {
  return wire().fds.begin()->second;
}

void send_datagram_locked(int to_index, std::vector<uint8_t> bytes) {
  Wire& w = wire();
  if (w.queued.empty()) {
    bool busy = false;
    if (try_send(any_fd(), to_index, bytes, &busy) || !busy) return;
  }
  if (w.queued.size() >= kMaxQueued) {  // congestion loss: the requester retries
    fake_log("wire: %zu datagrams wait for room; one to fake%d lost", w.queued.size(), to_index);
    return;
  }
  w.queued.emplace_back(to_index, std::move(bytes));
}

void flush_queued_locked() {
  Wire& w = wire();
  while (!w.queued.empty()) {
    bool busy = false;
    try_send(any_fd(), w.queued.front().first, w.queued.front().second, &busy);
    if (busy) return;
    w.queued.pop_front();
  }
}

std::vector<uint8_t> datagram(const Header& h, const uint8_t* payload, size_t bytes) {
  if (bytes > kWireMaxPayload)
    fake_fatal("wire: a message of %zu bytes; the fake's wire carries at most %u per message",
               bytes, kWireMaxPayload);
  std::vector<uint8_t> out(sizeof h + bytes);
  Header copy = h;
  copy.magic = kMagic;
  copy.payload_bytes = uint32_t(bytes);
  std::memcpy(out.data(), &copy, sizeof copy);
  if (bytes != 0) std::memcpy(out.data() + sizeof copy, payload, bytes);
  return out;
}

void answer(const Header& request, Response response, const std::vector<uint8_t>& reply) {
  Header h{};
  h.kind = kKindResponse;
  h.response = uint8_t(response);
  h.src_dev = request.dst_dev;
  h.dst_dev = request.src_dev;
  h.src_qpn = request.dst_qpn;
  h.dst_qpn = request.src_qpn;
  h.psn = request.psn;
  std::memcpy(h.src_gid, request.dst_gid, sizeof h.src_gid);
  std::memcpy(h.dst_gid, request.src_gid, sizeof h.dst_gid);
  h.length = uint32_t(reply.size());
  send_datagram_locked(request.src_dev, datagram(h, reply.data(), reply.size()));
}

bool reads_back(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
         op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

void serve_request_locked(const Header& h, const uint8_t* payload) {
  Device* dev = local_device(h.dst_dev);
  if (dev == nullptr || !dev->port_up || dev->drop) return;  // lost on the way in
  Qp* r = find_qp_locked(dev, h.dst_qpn);
  if (r == nullptr) return;
  const ibv_qp_state state = r->attr.qp_state;
  if (state != IBV_QPS_RTR && state != IBV_QPS_RTS && state != IBV_QPS_SQD) return;
  if (!addressed_to_locked(r, gid_from(h.src_gid), gid_from(h.dst_gid))) {
    fake_log("wire: a request to QP %u from an address it is not connected to: dropped", h.dst_qpn);
    return;
  }
  Request req;
  req.opcode = ibv_wr_opcode(h.opcode);
  req.src_qpn = h.src_qpn;
  req.solicited = h.solicited != 0;
  req.imm_data = h.imm_data;
  req.remote_addr = h.remote_addr;
  req.rkey = h.rkey;
  req.compare_add = h.compare_add;
  req.swap = h.swap;
  req.length = h.length;
  req.payload = payload;
  const uint32_t behind = (r->wire_expected_psn - h.psn) & kPsnMask;
  std::vector<uint8_t> reply;
  if (behind == 0) {
    const Response response = respond_locked(r, req, &reply);
    if (response == Response::kRnrNak) return answer(h, response, reply);
    r->wire_expected_psn = (r->wire_expected_psn + 1) & kPsnMask;
    // A responder that NAKs a request with an error goes to ERR, as rxe's does (class C/A
    // errors): a retry of the request (its NAK lost) is then never acknowledged as a success.
    if (response != Response::kAck) move_qp_to_error_locked(r);
    if (response == Response::kAck && reads_back(req.opcode)) {
      r->wire_recent_replies.push_back(WireResponse{h.psn, response, reply});
      if (r->wire_recent_replies.size() > kRecentReplies) r->wire_recent_replies.pop_front();
    }
    return answer(h, response, reply);
  }
  if (behind < (kPsnMask + 1) / 2) {  // a duplicate: its answer was lost
    if (reads_back(req.opcode)) {
      for (const WireResponse& old : r->wire_recent_replies)
        if (old.psn == h.psn) return answer(h, Response::kAck, old.reply);
      fake_log("wire: a retry of READ/atomic PSN %u on QP %u has no recorded answer", h.psn,
               h.dst_qpn);
      return;
    }
    return answer(h, Response::kAck, reply);
  }
  fake_log("wire: QP %u expects PSN %u, got %u from QP %u: ignored", h.dst_qpn,
           r->wire_expected_psn, h.psn, h.src_qpn);
}

void take_response_locked(const Header& h, const uint8_t* reply) {
  Device* dev = local_device(h.dst_dev);
  if (dev == nullptr || !dev->port_up || dev->drop) return;
  Qp* qp = find_qp_locked(dev, h.dst_qpn);
  if (qp == nullptr || qp->send_queue.empty()) return;
  const SendWork& head = qp->send_queue.front();
  if (!head.wire_sent || head.psn != h.psn) return;  // an answer to an older try
  // Only from the QP it is connected to, as rxe checks a packet's source: a late answer of an
  // old peer never completes the request of a reconnected QP.
  if (h.src_qpn != qp->attr.dest_qp_num ||
      h.src_dev != wire_device_index_for_gid(qp->attr.ah_attr.grh.dgid) ||
      !addressed_to_locked(qp, gid_from(h.src_gid), gid_from(h.dst_gid))) {
    return;
  }
  if (h.response < uint8_t(Response::kAck) || h.response > uint8_t(Response::kRemOpErr)) return;
  if (Response(h.response) == Response::kAck && dev->lose_acks > 0) {
    --dev->lose_acks;  // executed; the requester never hears of it and retries
    ++dev->stats.acks_lost;
    fake_log("wire: the acknowledgement of PSN %u to QP %u lost (injected)", h.psn, h.dst_qpn);
    return;
  }
  qp->wire_response = WireResponse{h.psn, Response(h.response),
                                   std::vector<uint8_t>(reply, reply + h.payload_bytes)};
}

void handle_datagram_locked(const uint8_t* bytes, size_t len) {
  Header h;
  if (len < sizeof h) return;
  std::memcpy(&h, bytes, sizeof h);
  if (h.magic != kMagic || sizeof h + h.payload_bytes != len) return;
  const uint8_t* payload = bytes + sizeof h;
  if (h.kind == kKindRequest) {
    if (h.payload_bytes != (reads_back(ibv_wr_opcode(h.opcode)) ? 0 : h.length)) return;
    serve_request_locked(h, payload);
  } else if (h.kind == kKindResponse) {
    take_response_locked(h, payload);
  }
}


// fork(): the wire thread takes the fabric lock every millisecond, and a child inheriting it
// held would deadlock on its first verb. Around fork() the thread is parked outside the lock
// (the fabric lock itself is not taken there: the shim's fork handlers take its engine lock,
// under which its thread calls verbs, and the two orders could deadlock). The child, which has
// no wire thread, leaves the wire: its QPs towards other hosts see a dead path, and it never
// takes its parent's datagrams.
struct Parking {
  std::mutex mutex;
  std::condition_variable changed;
  bool requested = false;
  bool parked = false;
};
Parking& parking() {
  static Parking* instance = new Parking();
  return *instance;
}
void park_if_asked() {
  Parking& p = parking();
  std::unique_lock lock(p.mutex);
  if (!p.requested) return;
  p.parked = true;
  p.changed.notify_all();
  p.changed.wait(lock, [&] { return !p.requested; });
  p.parked = false;
}
void before_fork() {
  Parking& p = parking();
  std::unique_lock lock(p.mutex);
  p.requested = true;
  p.changed.wait(lock, [&] { return p.parked; });  // within a millisecond: poll()'s timeout
}
void after_fork_in_parent() {
  Parking& p = parking();
  {
    std::lock_guard lock(p.mutex);
    p.requested = false;
  }
  p.changed.notify_all();
}
void after_fork_in_child() {
  new (&parking()) Parking();  // the parked thread is not in the child
  Fabric& f = fabric();
  for (const auto& [index, fd] : wire().fds) close(fd);
  wire().fds.clear();
  wire().queued.clear();
  f.wire = false;
}

// The thread that stands for the NICs while nobody calls a verb: it waits for a datagram or the
// next millisecond, then runs a progress step (which serves the wire, wire_serve_locked).
[[noreturn]] void serve_forever(std::vector<pollfd> fds) {
  for (;;) {
    poll(fds.data(), nfds_t(fds.size()), 1);
    park_if_asked();
    auto lock = fabric_lock();
    progress_step_locked();
  }
}

}  // namespace

void wire_serve_locked() {
  Wire& w = wire();
  for (const auto& [index, fd] : w.fds) {
    for (;;) {
      ssize_t n = recv(fd, w.buffer.data(), w.buffer.size(), MSG_DONTWAIT);
      if (n < 0) break;
      handle_datagram_locked(w.buffer.data(), size_t(n));
    }
  }
  flush_queued_locked();
}

uint64_t wire_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

uint64_t wire_transport_timeout_ns(uint8_t timeout) {
  if (timeout == 0) return UINT64_MAX;  // no retransmit timer (IB spec, rxe): waits for ever
  const uint64_t ns = 4096ull << (timeout > 31 ? 31 : timeout);
  return ns < 1'000'000ull ? 1'000'000ull : ns;
}

int wire_device_index_for_gid(const ibv_gid& gid) {
  Fabric& f = fabric();
  if (!f.wire) return -1;
  int host = -1;
  int rail = -1;
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t kLinkLocal[14] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xfa, 0x4e, 0, 0, 0};
  if (std::memcmp(gid.raw, kMapped, 12) == 0 && gid.raw[12] == 198 && gid.raw[13] == 18) {
    rail = gid.raw[14] - 1;
    host = gid.raw[15] - 1;
  } else if (std::memcmp(gid.raw, kLinkLocal, 14) == 0) {
    host = gid.raw[14];
    rail = gid.raw[15];
  }
  if (host < 0 || host == f.wire_host || rail < 0 || rail > 1) return -1;
  return host * 2 + rail;
}

void wire_send_request_locked(Qp* qp, uint32_t psn, int remote_index, const Request& request) {
  Header h{};
  h.kind = kKindRequest;
  h.opcode = uint8_t(request.opcode);
  h.solicited = request.solicited ? 1 : 0;
  h.src_dev = qp->ctx->device->index;
  h.dst_dev = remote_index;
  h.src_qpn = qp->shell.qpx.qp_base.qp_num;
  h.dst_qpn = qp->attr.dest_qp_num;
  h.psn = psn;
  std::memcpy(h.src_gid, source_gid_locked(qp).raw, sizeof h.src_gid);
  std::memcpy(h.dst_gid, qp->attr.ah_attr.grh.dgid.raw, sizeof h.dst_gid);
  h.imm_data = request.imm_data;
  h.rkey = request.rkey;
  h.length = request.length;
  h.remote_addr = request.remote_addr;
  h.compare_add = request.compare_add;
  h.swap = request.swap;
  const size_t bytes = reads_back(request.opcode) ? 0 : request.length;
  if (request.length > kWireMaxPayload)  // said here, not by the responder's process
    fake_fatal("wire: a %s of %u bytes; the fake's wire carries at most %u per message",
               reads_back(request.opcode) ? "READ" : "message", request.length, kWireMaxPayload);
  send_datagram_locked(remote_index, datagram(h, request.payload, bytes));
}

void wire_start_locked() {
  Fabric& f = fabric();
  std::vector<pollfd> fds;
  for (auto& d : f.devices) {
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) fake_fatal("wire: socket: %s", std::strerror(errno));
    int size = int(4 * (sizeof(Header) + kWireMaxPayload));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    socklen_t len = 0;
    sockaddr_un a = address_of(d->index, &len);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0)
      fake_fatal("wire: fabric '%s' host %d: fake%d is taken (%s): two processes claim one host",
                 f.wire_name.c_str(), f.wire_host, d->index, std::strerror(errno));
    wire().fds[d->index] = fd;
    fds.push_back(pollfd{fd, POLLIN, 0});
  }
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  std::thread(serve_forever, std::move(fds)).detach();
  fake_log("wire: fabric '%s', this process is host %d", f.wire_name.c_str(), f.wire_host);
}

}  // namespace fake_verbs
