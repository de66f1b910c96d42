#include "options.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace nccl_pattern {
namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "nccl_pattern: %s\n"
               "usage: nccl_pattern --rank R --nranks N --listen PORT --next HOST:PORT --dev DEV\n"
               "                    [--prev-dev DEV] [common options]\n"
               "       nccl_pattern --local-ranks 2|4 [common options]   (fake fabric, one process)\n"
               "common: --iters K --bytes S --chunk-bytes C --qps-per-conn Q --fifo-depth D\n"
               "        --gid-index G --ib-timeout T --timeout-s SEC --seed X\n"
               "        --inject-port-down-after N   (single-process mode on the fake only)\n"
               "        --inject-port-up-after N     (then the port comes back after N chunks)\n",
               why);
  std::exit(2);
}

uint64_t number(const char* flag, const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 0);
  if (end == text || *end != '\0') usage((std::string("not a number for ") + flag + ": " + text).c_str());
  return value;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const char* value = argv[++i];
    if (flag == "--rank") o.rank = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--nranks") o.nranks = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--local-ranks") o.local_ranks = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--listen") o.listen_port = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--next") o.next_addr = value;
    else if (flag == "--dev") o.dev = value;
    else if (flag == "--prev-dev") o.prev_dev = value;
    else if (flag == "--gid-index") o.gid_index = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--qps-per-conn") o.qps_per_conn = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--iters") o.iters = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--bytes") o.bytes = number(argv[i - 1], value);
    else if (flag == "--chunk-bytes") o.chunk_bytes = number(argv[i - 1], value);
    else if (flag == "--fifo-depth") o.fifo_depth = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--ib-timeout") o.ib_timeout = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--timeout-s") o.timeout_s = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--seed") o.seed = number(argv[i - 1], value);
    else if (flag == "--inject-port-down-after")
      o.inject_port_down_after = static_cast<int>(number(argv[i - 1], value));
    else if (flag == "--inject-port-up-after")
      o.inject_port_up_after = static_cast<int>(number(argv[i - 1], value));
    else usage(("unknown option " + flag).c_str());
  }
  if (o.local_ranks > 0) {
    if (o.local_ranks != 2 && o.local_ranks != 4) usage("--local-ranks must be 2 or 4 (two fake hosts)");
    o.nranks = o.local_ranks;
  } else {
    if (o.nranks < 2 || o.rank < 0 || o.rank >= o.nranks) usage("need --nranks >= 2 and 0 <= --rank < N");
    if (o.listen_port <= 0 || o.next_addr.empty() || o.dev.empty()) usage("need --listen, --next and --dev");
    if (o.prev_dev.empty()) o.prev_dev = o.dev;
    if (o.inject_port_down_after >= 0) usage("--inject-port-down-after needs --local-ranks (fake fabric)");
  }
  if (o.qps_per_conn < 1 || o.qps_per_conn > 8) usage("--qps-per-conn must be 1..8");
  if (o.fifo_depth < 1 || o.fifo_depth > 32) usage("--fifo-depth must be 1..32");
  if (o.iters < 1) usage("--iters must be >= 1");
  if (o.bytes == 0 || o.bytes % (8ull * static_cast<uint64_t>(o.nranks)) != 0)
    usage("--bytes must be a non-zero multiple of 8 * nranks (int64 elements, equal segments)");
  if (o.chunk_bytes == 0 || o.chunk_bytes % 8 != 0) usage("--chunk-bytes must be a non-zero multiple of 8");
  if (o.ib_timeout < 1 || o.ib_timeout > 31) usage("--ib-timeout must be 1..31");
  if (o.timeout_s < 1) usage("--timeout-s must be >= 1");
  return o;
}

}  // namespace nccl_pattern
