// nccl_pattern: a workload that drives verbs the way NCCL's IB transport does (written from
// docs in /work/shared/docs/verbs-facts.md, no NCCL code), as a ring all-reduce. See
// docs/workloads.md for the traffic, the rank layout and the output.
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "failure.h"
#include "options.h"
#include "ring_allreduce.h"
#include "verbs_api.h"

using namespace nccl_pattern;

namespace {

// Single-process layout over the fake fabric (fake<2*host + rail>): rank r is on host r % 2 and
// rail r / 2, so ring neighbours are always on different hosts, and the connection to the next
// rank uses the sender's rail on both ends (see docs/workloads.md).
int host_of(int rank) { return rank % 2; }
int rail_of(int rank) { return rank / 2; }
std::string fake_device(int host, int rail) { return "fake" + std::to_string(2 * host + rail); }

// A control function of the fake libibverbs, through the handle the program got for libibverbs.
// Under the shim that handle is the shim's, which exports libibverbs' verbs and nothing else of
// it; the shim has loaded libibverbs (here the fake) into the global scope, where it is found.
int (*fake_port_control(void* handle, const char* name))(int) {
  void* symbol = dlvsym(handle, name, "FAKE_VERBS_1.0");
  if (symbol == nullptr) symbol = dlvsym(RTLD_DEFAULT, name, "FAKE_VERBS_1.0");
  return reinterpret_cast<int (*)(int)>(symbol);
}

int run_local(const Options& options) {
  const int n = options.local_ranks;
  int (*port_down)(int) = nullptr;
  if (options.inject_port_down_after >= 0) {
    // Looked up through the libibverbs handle: the fake is loaded privately (no RTLD_GLOBAL),
    // exactly like NCCL loads the real one.
    void* handle = nullptr;
    try {
      handle = verbs().handle;
    } catch (const WorkloadError& e) {
      std::printf("nccl_pattern: FAIL %s\n", e.what());
      return 2;
    }
    port_down = fake_port_control(handle, "fake_verbs_port_down");
    if (port_down == nullptr) {
      std::printf("nccl_pattern: FAIL --inject-port-down-after needs the fake libibverbs (no fake_verbs_port_down)\n");
      return 2;
    }
  }
  std::vector<RankPlan> plans(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int next = (r + 1) % n;
    const int prev = (r - 1 + n) % n;
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      std::perror("socketpair");
      return 2;
    }
    RankPlan& p = plans[static_cast<size_t>(r)];
    p.options = &options;
    p.rank = r;
    p.dev = fake_device(host_of(r), rail_of(r));
    p.prev_dev = fake_device(host_of(r), rail_of(prev));
    p.next_name = "rank " + std::to_string(next) + " (" + fake_device(host_of(next), rail_of(r)) + ")";
    p.prev_name = "rank " + std::to_string(prev) + " (" + fake_device(host_of(prev), rail_of(prev)) + ")";
    p.to_next = OobLink(fds[0]);
    plans[static_cast<size_t>(next)].from_prev = OobLink(fds[1]);
    if (r == 0) p.inject_port_down = port_down;
    if (r == 0 && options.inject_port_up_after >= 0) {
      p.inject_port_up = fake_port_control(verbs().handle, "fake_verbs_port_up");
    }  // rank 0's rail (host A, rail 0) goes down
  }
  std::vector<int> passed(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { passed[static_cast<size_t>(r)] = run_rank(plans[static_cast<size_t>(r)]) ? 1 : 0; });
  for (auto& t : threads) t.join();
  int failures = 0;
  for (int ok : passed) failures += ok == 0;
  return failures == 0 ? 0 : 1;
}

int run_one(const Options& options) {
  const int next = (options.rank + 1) % options.nranks;
  const int prev = (options.rank - 1 + options.nranks) % options.nranks;
  RankPlan plan;
  plan.options = &options;
  plan.rank = options.rank;
  plan.dev = options.dev;
  plan.prev_dev = options.prev_dev;
  plan.next_name = "rank " + std::to_string(next) + " (" + options.next_addr + ")";
  plan.prev_name = "rank " + std::to_string(prev);
  try {
    verbs();  // fail early, before the bootstrap, when libibverbs cannot be loaded like NCCL does
    const auto until = Clock::now() + std::chrono::seconds(options.timeout_s);
    const int listen_fd = listen_on(options.listen_port);
    plan.to_next = connect_to(options.next_addr, until);
    plan.from_prev = accept_one(listen_fd, until);
    ::close(listen_fd);
  } catch (const WorkloadError& e) {
    std::printf("nccl_pattern: rank %d FAIL %s\n", options.rank, e.what());
    return 1;
  }
  return run_rank(plan) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  return options.local_ranks > 0 ? run_local(options) : run_one(options);
}
