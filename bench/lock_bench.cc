// What one uncontended take-and-release of the data path's lock costs on this CPU: biased to the
// calling thread (the healthy case), as the ticket lock alone (bias switched off), against the
// loop alone and a test-and-set lock (the one core/spin_lock.h had before its ticket lock). The
// healthy post takes one such lock (the QP's), an empty poll one (the CQ's), a poll that reaps
// completions two (the CQ's, then the QP's): this is the floor of what the shim adds to those
// calls (bench/README.md). One thread, nothing contends.
// Usage: lock_bench [batches]   prints the median over batches of 1000 pairs, ns per pair.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/spin_lock.h"

namespace {

class TestAndSetLock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

constexpr int kPairsPerBatch = 1000;

template <typename Body>
double median_ns_per_pair(long batches, Body&& body) {
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(batches));
  for (long b = 0; b < batches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kPairsPerBatch; ++i) body();
    const auto end = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::nano>(end - start).count() /
                      kPairsPerBatch);
  }
  std::nth_element(samples.begin(), samples.begin() + static_cast<long>(samples.size() / 2),
                   samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long batches = argc > 1 ? std::atol(argv[1]) : 20000;
  if (batches <= 0) {
    std::fprintf(stderr, "usage: lock_bench [batches > 0]\n");
    return 2;
  }
  vf::SpinLock biased;  // this thread claims it after a few acquisitions
  // Switched off by one revocation from another thread: the ticket lock alone, as before the bias.
  vf::SpinLock ticket(1);
  for (std::uint32_t i = 0; i < vf::SpinLock::kClaimStreak; ++i) {
    ticket.lock();
    ticket.unlock();
  }
  std::thread([&] {
    ticket.lock();
    ticket.unlock();
  }).join();
  TestAndSetLock test_and_set;
  // The compiler barrier keeps each iteration (and the loop) from being folded away.
  const double loop = median_ns_per_pair(batches, [] { asm volatile("" ::: "memory"); });
  const double ticket_ns = median_ns_per_pair(batches, [&] {
    ticket.lock();
    asm volatile("" ::: "memory");
    ticket.unlock();
  });
  for (std::uint32_t i = 0; i < vf::SpinLock::kClaimStreak; ++i) {
    biased.lock();
    biased.unlock();
  }
  const double biased_ns = median_ns_per_pair(batches, [&] {
    biased.lock();
    asm volatile("" ::: "memory");
    biased.unlock();
  });
  const double tas_ns = median_ns_per_pair(batches, [&] {
    test_and_set.lock();
    asm volatile("" ::: "memory");
    test_and_set.unlock();
  });
  std::printf(
      "loop_ns=%.2f biased_lock_pair_ns=%.2f ticket_lock_pair_ns=%.2f test_and_set_pair_ns=%.2f "
      "batches=%ld bias=%s\n",
      loop, biased_ns, ticket_ns, tas_ns, batches,
      !biased.biased_to_this_thread() ? "unavailable"
      : ticket.bias_switched_off()    ? "measured"
                                      : "not-switched-off");
  // The figures would lie if the locks were not in the state their names say.
  return biased.biased_to_this_thread() == vf::SpinLock::bias_available() &&
                 (ticket.bias_switched_off() || !vf::SpinLock::bias_available())
             ? 0
             : 1;
}
