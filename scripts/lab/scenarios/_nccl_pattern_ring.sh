# shellcheck shell=bash
# Shared by the nccl_pattern scenarios (a name starting with _ is not a scenario itself): two
# processes per host, each bound to ONE rail, like NCCL channels each bound to one NIC.
#   ring 0 = process 0 of A + process 0 of B, a 2-rank ring all-reduce entirely on rxe0 (rail 0)
#   ring 1 = process 1 of A + process 1 of B, a 2-rank ring all-reduce entirely on rxe1 (rail 1)
# Every QP of a process (to the next rank, from the previous rank, the self-connected flush QP)
# is on its own device, so the shim protects process 0 with rail 1 as backup and process 1 with
# rail 0 (docs/workloads.md, "Rank layout"). Jobs are named pK on both hosts (K = process = ring
# = rail); in each ring A's process is rank 0 and B's is rank 1.
NCCL_JOBS=(A:p0 B:p0 A:p1 B:p1)

# start_nccl_rings ITERS BYTES TIMEOUT_S [VAR=VALUE...]: both rings, four processes. Each rank
# listens first, then connects to the next (bounded retries), so they may start in any order.
# VAR=VALUE words go to every process (e.g. the shim's settings).
start_nccl_rings() {
  local iters=$1 bytes=$2 timeout_s=$3 p
  shift 3
  for p in 0 1; do
    start_nccl_ring "A:p$p" "B:p$p" "$(nccl_port A "$p")" "$(nccl_port B "$p")" "rxe$p" \
      "$iters" "$bytes" "$timeout_s" "$@"
  done
}

# start_nccl_ring HOST:JOB0 HOST:JOB1 PORT0 PORT1 DEV ITERS BYTES TIMEOUT_S [VAR=VALUE...]: one
# 2-rank ring, rank 0 as JOB0 listening on PORT0, rank 1 as JOB1 on PORT1, every QP on DEV (both
# jobs may be on one host: then its QPs loop back through DEV itself).
start_nccl_ring() {
  local jobs=("$1" "$2") ports=("$3" "$4") dev=$5 iters=$6 bytes=$7 timeout_s=$8 rank peer
  shift 8
  local bin=$REPO_DIR/build/bin/nccl_pattern
  [[ -x $bin ]] || lab_fail "nccl_pattern is not built: $bin"
  for rank in 0 1; do
    peer=$((1 - rank))
    app "${jobs[rank]%%:*}" "${jobs[rank]#*:}" "$@" -- stdbuf -oL "$bin" --rank "$rank" --nranks 2 \
      --listen "${ports[rank]}" --next "$(ip_of "${jobs[peer]%%:*}" mgmt):${ports[peer]}" \
      --dev "$dev" --prev-dev "$dev" --gid-index 1 --qps-per-conn 2 \
      --iters "$iters" --bytes "$bytes" --chunk-bytes 16384 --ib-timeout 14 --timeout-s "$timeout_s"
  done
}

# nccl_port HOST PROCESS: the bootstrap port a process listens on (distinct per host and process).
nccl_port() {
  local off=0
  [[ $1 == B ]] && off=100
  printf '%s' $((LAB_PORT + off + 200 * $2))
}

# nccl_wait_started TIMEOUT: every process printed "traffic started" (else lab_fail).
nccl_wait_started() {
  local j
  for j in "${NCCL_JOBS[@]}"; do
    wait_log "${j%%:*}" "${j#*:}" 'traffic started' "$1" || lab_fail "$j did not start its traffic"
  done
}

# nccl_summary HOST JOB: the process's PASS/FAIL summary line (empty if none).
nccl_summary() {
  grep -m1 '^nccl_pattern: rank [0-9] \(PASS\|FAIL\)' "$SCEN_DIR/$1/$2.log" 2>/dev/null || true
}

# nccl_check_pass: every process exited 0 with a PASS line; notes the first problems. Status 0/1.
nccl_check_pass() {
  local j line st rc=0
  for j in "${NCCL_JOBS[@]}"; do
    line=$(nccl_summary "${j%%:*}" "${j#*:}")
    st=$(job_rc "${j%%:*}" "${j#*:}")
    if [[ $st != 0 || $line != *" PASS "* ]]; then
      note "$j: status ${st:-running}: ${line:-no summary line}"
      rc=1
    fi
  done
  return "$rc"
}

# nccl_protected HOST JOB: the process's shim logged each of its 5 QPs (2 per connection, and the
# flush QP) protected.
nccl_protected() {
  (($(shim_log_count "$1" "$2" 'protected — standby qp') >= 5))
}

# nccl_wait_protected TIMEOUT: every process's QPs are protected (pairing runs in the background
# after RTR and may take seconds on a loaded machine): a fault meant for protected pairs must not
# come first (else lab_fail). With the shim only.
nccl_wait_protected() {
  local j
  for j in "${NCCL_JOBS[@]}"; do
    wait_for "$1" nccl_protected "${j%%:*}" "${j#*:}" ||
      lab_fail "$j: its 5 QPs were not all protected within $1 s of the traffic's start"
  done
}
