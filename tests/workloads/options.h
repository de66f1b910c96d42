// Command line of nccl_pattern. Two modes:
//  - one rank per process (the lab): --rank R --nranks N --listen PORT --next HOST:PORT
//    --dev DEV [--prev-dev DEV]
//  - single process (ctest on the fake fabric): --local-ranks N, ranks run as threads and the
//    out-of-band links are socketpairs; devices follow the two-host layout (docs/workloads.md).
#pragma once

#include <cstdint>
#include <string>

namespace nccl_pattern {

struct Options {
  int rank = -1;
  int nranks = 0;
  int local_ranks = 0;      // > 0: single-process mode
  int listen_port = 0;      // accepts the link from the previous rank
  std::string next_addr;    // HOST:PORT of the next rank's listener
  std::string dev;          // own rail: the connection to the next rank
  std::string prev_dev;     // the connection from the previous rank (its rail); default: dev
  int gid_index = 1;        // RoCEv2 IPv4 GID in the lab and on the fake
  int qps_per_conn = 2;
  int iters = 2;
  uint64_t bytes = 64 * 1024;         // all-reduce size per iteration
  uint64_t chunk_bytes = 16 * 1024;   // one clear-to-send grants one chunk
  int fifo_depth = 4;                 // clear-to-send slots (chunks in flight per connection)
  int ib_timeout = 20;                // NCCL_IB_TIMEOUT default
  int timeout_s = 60;                 // deadline of every wait
  uint64_t seed = 1;
  int inject_port_down_after = -1;    // fake only: port of rank 0's rail goes down after N chunks
  int inject_port_up_after = -1;      // fake only: ... and comes back after N chunks (failback)
};

// Parses and validates; prints usage and exits 2 on a bad command line.
Options parse_options(int argc, char** argv);

}  // namespace nccl_pattern
