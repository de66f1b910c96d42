// One rank of the ring all-reduce: sets up its two connections (to the next rank, from the
// previous rank) and a self-connected flush QP, then runs reduce-scatter + all-gather with
// NCCL's traffic pattern and verifies every received byte and every completion.
#pragma once

#include <cstdint>
#include <string>

#include "oob_socket.h"
#include "options.h"

namespace nccl_pattern {

struct RankPlan {
  const Options* options = nullptr;
  int rank = 0;
  std::string dev;       // connection to the next rank (own rail)
  std::string prev_dev;  // connection from the previous rank (its rail)
  std::string next_name; // how messages name the peers, e.g. "rank 1 (198.18.0.2:18601)"
  std::string prev_name;
  OobLink to_next;
  OobLink from_prev;
  int (*inject_port_down)(int) = nullptr;  // the fake's fault API, when requested
  int (*inject_port_up)(int) = nullptr;
};

// Prints the rank's summary line (PASS with counters, or FAIL with the reason); true on PASS.
bool run_rank(RankPlan& plan);

}  // namespace nccl_pattern
