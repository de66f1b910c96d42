# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: the NCCL-pattern workload (tests/workloads, docs/workloads.md) as a 4-rank ring
# all-reduce, two processes per host. Rank r runs on host A (even r) or B (odd r) and sends on
# rail r/2 (rxe0 for ranks 0,1 = "process 0" of each host; rxe1 for ranks 2,3 = "process 1");
# the connection from its previous rank uses that rank's rail. So every ring hop crosses hosts
# on one rail: 0->1 and 1->2 on rail 0, 2->3 and 3->0 on rail 1. Every rank verifies every byte
# and completion and must exit 0.
SCENARIO_DESC="NCCL-pattern ring all-reduce, 4 ranks (2 per host, rail = process), all bytes verified; all exit 0"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=120

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

scenario_run() {
  local r rc=0 line
  start_nccl_ring 8 262144 40
  wait_jobs 90 A:rank0 B:rank1 A:rank2 B:rank3 || rc=1
  for r in 0 1 2 3; do
    line=$(grep -m1 "^nccl_pattern: rank $r \(PASS\|FAIL\)" "$SCEN_DIR/${NCCL_RING_HOSTS[r]}/rank$r.log" || true)
    [[ $line == *" PASS "* ]] || { note "rank $r: ${line:-no summary line (status $(job_rc "${NCCL_RING_HOSTS[r]}" "rank$r"))}"; rc=1; }
  done
  line=$(grep -m1 '^nccl_pattern: rank 0 PASS' "$SCEN_DIR/A/rank0.log" || true)
  if [[ -n $line ]]; then
    local kv
    for kv in iters bytes write_imms reads seconds; do
      figure "$kv" "$(grep -o " $kv=[^ ]*" <<<"$line" | cut -d= -f2)"
    done
  fi
  return "$rc"
}
