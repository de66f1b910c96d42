# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Measurement (not in `lab all`), issue 20 item 2: how long traffic stops when a rail turns into a
# black hole (its port ACTIVE, every frame dropped both ways: `fault blackhole`, no event; only the
# requests' transport retries running out tell the shim). Five ib_write_bw runs with a black hole
# of A's rail 0 mid-run, each restored before the next (_fault_time.sh): each fault-to-first-
# completion time and their median. Then the other half of the item: a loaded run without a
# fault (the same ib_write_bw, 2000 x 64 KiB at full speed) must show zero failovers on both
# hosts, or the shim's detection is too eager for a busy but healthy path.
SCENARIO_DESC="measurement: 5 x (ib_write_bw, blackhole A rail0, restore) with the shim, then a loaded run without a fault: fault-to-resume ms and median, zero failovers unfaulted"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_ALL=no
SCENARIO_TIMEOUT=900

# shellcheck source=scripts/lab/scenarios/_fault_time.sh
source "$LAB_DIR/scenarios/_fault_time.sh"

scenario_run() {
  local rc=0
  fault_time_rounds blackhole || rc=1
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  local port=$((LAB_PORT + 50)) iters=2000
  local args=(-d rxe0 -x 1 -s 65536 -n "$iters" -p "$port" "${PERFTEST_OPTS[@]}")
  app B loaded_srv "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}"
  wait_listen B "$port" 30 || lab_fail "the loaded run's server did not listen"
  app A loaded_cli "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
  expect_exit_zero 120 A:loaded_cli B:loaded_srv || rc=1
  [[ $(perftest_figure A loaded_cli 2) == "$iters" ]] || { note "loaded run: not $iters iterations"; rc=1; }
  local h
  for h in A:loaded_cli B:loaded_srv; do
    assert_stats "${h%%:*}" "${h#*:}" \
      'len(qps(s)) > 0 and all(q["failovers"] == 0 and q["protected"] for q in qps(s))' || rc=1
  done
  figure loaded_failovers 0
  return "$rc"
}
