# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 6, the peer process's death: the NCCL-pattern rings between the hosts (process 0 of
# each host on rxe0, process 1 on rxe1, each protected by the other rail), the workload's watchdog
# at 20 s. Once every QP is protected, A's process 0 is killed with SIGKILL (no exit handler, its
# QPs and its shim's sessions torn down by the kernel). Its peer, B's process 0, must end as it
# would without the shim: with an error (a completion error, or its watchdog), within the watchdog
# + 30 s, never a hang or a crash; its shim must not move the traffic to a standby that leads
# nowhere as if it were a link failure and report success. Ring 1 (A and B's process 1), whose
# QPs never touched the killed process, must finish with its full count and no failover.
SCENARIO_DESC="kill -9 of A's rank 0 mid nccl_pattern: its peer ends with an error within the watchdog + 30 s, ring 1 unharmed"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

PEER_KILLED_WATCHDOG_S=20

scenario_run() {
  local rc=0 j st line pid
  cut_shim_env
  start_nccl_rings "$CUT_NCCL_ITERS" 131072 "$PEER_KILLED_WATCHDOG_S" "${CUT_ENV[@]}"
  nccl_wait_started 60
  nccl_wait_protected 60
  after_seconds "$CUT_AFTER"
  for j in "${NCCL_JOBS[@]}"; do
    [[ -z $(job_rc "${j%%:*}" "${j#*:}") ]] ||
      lab_fail "$j ended before the kill (status $(job_rc "${j%%:*}" "${j#*:}")): make the run longer (VF_CUT_NCCL_ITERS)"
  done
  # The job's header line names its pid (stdbuf execs the program: the same process).
  pid=$(sed -n 's/^# .* job p0 pid \([0-9]*\): .*/\1/p' "$SCEN_DIR/A/p0.log" | head -n 1)
  [[ -n $pid ]] || lab_fail "no pid in A/p0.log's header"
  run_on A kill9 10 -- kill -9 "$pid" || lab_fail "kill -9 $pid on A failed"
  local bound=$((PEER_KILLED_WATCHDOG_S + 30))
  wait_jobs "$bound" A:p0 B:p0 || true
  st=$(job_rc A p0)
  [[ $st == 137 ]] || { note "A:p0: status ${st:-running}, not 137 (SIGKILL)"; rc=1; }
  st=$(job_rc B p0)
  line=$(nccl_summary B p0)
  if [[ -z $st ]]; then
    note "B:p0: still running $bound s after its peer was killed (a hang)"
    kill_job B p0 --stacks
    rc=1
  elif ((st == 0 || st >= 128)); then
    note "B:p0: exit status $st, not an error exit: ${line:-no summary line}"
    rc=1
  elif [[ $line != *" FAIL NET/IB-like : Got completion from peer "*" status="* &&
    $line != *" FAIL timeout after "* ]]; then
    note "B:p0: not the error plain verbs would give: ${line:-no summary line}"
    rc=1
  fi
  figure b_p0 "${st:-hung}"
  # Ring 1 never touched the killed process: full count, PASS, no failover.
  wait_jobs "$CUT_BOUND" A:p1 B:p1 || true
  for j in A:p1 B:p1; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    line=$(nccl_summary "${j%%:*}" "${j#*:}")
    if [[ $st != 0 || $line != *" PASS "* ]]; then
      note "$j: status ${st:-running}: ${line:-no summary line}"
      [[ -n $st ]] || kill_job "${j%%:*}" "${j#*:}" --stacks
      rc=1
    fi
    assert_stats "${j%%:*}" "${j#*:}" 'totals(s)["failovers"] == 0' || rc=1
  done
  return "$rc"
}
