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

scenario_run() {
  local bin=$REPO_DIR/build/bin/nccl_pattern r rc=0 line
  [[ -x $bin ]] || lab_fail "nccl_pattern is not built: $bin"
  local -a hosts=(A B A B)
  for r in 0 1 2 3; do
    local next=$(((r + 1) % 4)) prev=$(((r + 3) % 4))
    # Ranks start in any order: each listens first, then connects to the next (bounded retries).
    app "${hosts[r]}" "rank$r" -- stdbuf -oL "$bin" --rank "$r" --nranks 4 \
      --listen $((LAB_PORT + 100 * r)) --next "$(ip_of "${hosts[next]}" mgmt):$((LAB_PORT + 100 * next))" \
      --dev "rxe$((r / 2))" --prev-dev "rxe$((prev / 2))" --gid-index 1 --qps-per-conn 2 \
      --iters 8 --bytes 262144 --chunk-bytes 16384 --ib-timeout 14 --timeout-s 40
  done
  wait_jobs 90 A:rank0 B:rank1 A:rank2 B:rank3 || rc=1
  for r in 0 1 2 3; do
    line=$(grep -m1 "^nccl_pattern: rank $r \(PASS\|FAIL\)" "$SCEN_DIR/${hosts[r]}/rank$r.log" || true)
    [[ $line == *" PASS "* ]] || { note "rank $r: ${line:-no summary line (status $(job_rc "${hosts[r]}" "rank$r"))}"; rc=1; }
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
