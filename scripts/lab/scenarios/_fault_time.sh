# shellcheck shell=bash
# The rounds of the measurement scenarios failover_time and blackhole_time (sourced by them):
# separate ib_write_bw runs (rxe0, 2000 x 64 KiB, shim on both sides); in each, a fault of A's
# rail 0 after 2 s of traffic, the run must finish (exit 0, full count, stats show the failover),
# then the fault is restored before the next run. Figures: each fault-to-first-completion time
# (the shim's resumed_unix_ns minus the fault time, both on A's clock; docs/lab.md "Failover
# statistics"; the fault time is when the fault command started, so each figure also holds up to
# err_ms of the command's own run time), their median, and the shim's own failover ms.

# fault_time_rounds KIND: VF_FAILOVER_ROUNDS (default 5) rounds with fault KIND.
fault_time_rounds() {
  local kind=$1 rounds=${VF_FAILOVER_ROUNDS:-5} i port rc=0 iters=2000
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  for ((i = 1; i <= rounds; i++)); do
    port=$((LAB_PORT + i))  # a fresh port: the previous server's socket may linger in TIME_WAIT
    local args=(-d rxe0 -x 1 -s 65536 -n "$iters" -p "$port" "${PERFTEST_OPTS[@]}")
    app B "srv$i" "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}"
    wait_listen B "$port" 30 || lab_fail "round $i: ib_write_bw server did not listen"
    app A "cli$i" "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
    wait_log A "cli$i" '#bytes' 30 || lab_fail "round $i: traffic did not start"
    after_seconds 2
    [[ -z $(job_rc A "cli$i") ]] || lab_fail "round $i: ib_write_bw ended before the fault: make the run longer"
    fault "$kind" A rail0
    if ! wait_jobs_or_failure 90 10 "A:cli$i" "B:srv$i"; then
      note "round $i: client $(job_rc A "cli$i") server $(job_rc B "srv$i")"
      rc=1
    fi
    kill_job A "cli$i"
    kill_job B "srv$i"
    [[ $(perftest_figure A "cli$i" 2) == "$iters" ]] || { note "round $i: not $iters iterations"; rc=1; }
    assert_failover A "cli$i" || rc=1
    assert_failover B "srv$i" || rc=1
    fault restore A rail0
    wait_guest A 30 port_state rxe0 ACTIVE || lab_fail "round $i: rxe0 on A did not come back ACTIVE"
    ((rc == 0)) || break
  done
  failover_figures A
  local ok=() v
  for v in "${FAILOVER_RESUME_MS[@]}"; do [[ $v == - ]] || ok+=("$v"); done
  if ((${#ok[@]})); then
    figure median_ms "$(printf '%s\n' "${ok[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')"
  fi
  ((${#ok[@]} == rounds)) || { note "fault-to-resume known for ${#ok[@]} of $rounds faults"; rc=1; }
  return "$rc"
}
