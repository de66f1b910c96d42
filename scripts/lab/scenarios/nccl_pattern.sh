# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: the NCCL-pattern workload (tests/workloads, docs/workloads.md) as two concurrent
# 2-rank ring all-reduces, two processes per host, each process on one rail: process 0 of A and
# of B form a ring on rxe0, process 1 of A and of B another on rxe1 (like NCCL channels each bound
# to one NIC). Every process verifies every byte and completion and must exit 0 with PASS.
SCENARIO_DESC="NCCL-pattern ring all-reduces, 2 per host, process 0 on rxe0 and process 1 on rxe1, bytes verified; all exit 0"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=120

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

scenario_run() {
  local rc=0 line kv
  start_nccl_rings 8 262144 40
  wait_jobs 90 "${NCCL_JOBS[@]}" || rc=1
  nccl_check_pass || rc=1
  line=$(nccl_summary A p0)
  if [[ $line == *" PASS "* ]]; then
    for kv in iters bytes write_imms reads seconds; do
      figure "$kv" "$(grep -o " $kv=[^ ]*" <<<"$line" | cut -d= -f2)"
    done
  fi
  return "$rc"
}
