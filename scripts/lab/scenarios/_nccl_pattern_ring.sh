# shellcheck shell=bash
# Shared by the nccl_pattern scenarios (a name starting with _ is not a scenario itself): starts
# the 4-rank ring, two ranks per host. Rank r runs on NCCL_RING_HOSTS[r] and sends on rail r/2
# (rxe0 for ranks 0,1 = "process 0" of each host; rxe1 for ranks 2,3 = "process 1"); the
# connection from its previous rank uses that rank's rail, so every hop crosses hosts on one rail.
NCCL_RING_HOSTS=(A B A B)

# start_nccl_ring ITERS BYTES TIMEOUT_S: each rank listens first, then connects to the next
# (bounded retries), so they may start in any order. Job names are rank0..rank3.
start_nccl_ring() {
  local iters=$1 bytes=$2 timeout_s=$3 r
  local bin=$REPO_DIR/build/bin/nccl_pattern
  [[ -x $bin ]] || lab_fail "nccl_pattern is not built: $bin"
  for r in 0 1 2 3; do
    local next=$(((r + 1) % 4)) prev=$(((r + 3) % 4))
    app "${NCCL_RING_HOSTS[r]}" "rank$r" -- stdbuf -oL "$bin" --rank "$r" --nranks 4 \
      --listen $((LAB_PORT + 100 * r)) \
      --next "$(ip_of "${NCCL_RING_HOSTS[next]}" mgmt):$((LAB_PORT + 100 * next))" \
      --dev "rxe$((r / 2))" --prev-dev "rxe$((prev / 2))" --gid-index 1 --qps-per-conn 2 \
      --iters "$iters" --bytes "$bytes" --chunk-bytes 16384 --ib-timeout 14 --timeout-s "$timeout_s"
  done
}
