# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 5, the double failure: both of A's rails go down (a top-of-rack reboot) while the
# NCCL-pattern rings run between the hosts (process 0 of each host on rxe0, process 1 on rxe1, each
# protected by the other rail), with VERBS_FAILOVER_GRACE_MS=5000 and the workload's own watchdog
# at 20 s (--timeout-s, as NCCL's). No path is left, so after the grace every cross-host process
# must end, as it would without the shim, with an error: a completion error ("Got completion from
# peer ... status=") or its watchdog ("timeout after"), within grace + 30 s of the fault; never a
# hang, a crash, an "unexpected completion" (a wr_id completed twice) or wrong data. A's shims must
# report those QPs unprotected. Meanwhile a second ring of two processes on B alone (its QPs loop
# back through B's rxe0, standby rxe1; both of B's rails stay up) must see nothing: it finishes with
# its full count, protected, without a single failover.
SCENARIO_DESC="port_down both rails of A mid nccl_pattern: every cross-host process ends with an error within grace+30 s, none hangs; a ring on B alone unharmed"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

DOUBLE_GRACE_MS=5000
DOUBLE_WATCHDOG_S=20
DOUBLE_LOCAL_JOBS=(B:l0 B:l1)

scenario_run() {
  local rc=0 j st line
  cut_shim_env
  start_nccl_rings "$CUT_NCCL_ITERS" 131072 "$DOUBLE_WATCHDOG_S" "${CUT_ENV[@]}" \
    "VERBS_FAILOVER_GRACE_MS=$DOUBLE_GRACE_MS"
  start_nccl_ring B:l0 B:l1 "$(nccl_port B 2)" "$(nccl_port B 3)" rxe0 "$CUT_NCCL_ITERS" 131072 60 \
    "${CUT_ENV[@]}"
  NCCL_JOBS+=("${DOUBLE_LOCAL_JOBS[@]}")
  nccl_wait_started 60
  nccl_wait_protected 60
  after_seconds "$CUT_AFTER"
  for j in "${NCCL_JOBS[@]}"; do
    [[ -z $(job_rc "${j%%:*}" "${j#*:}") ]] ||
      lab_fail "$j ended before the fault (status $(job_rc "${j%%:*}" "${j#*:}")): make the run longer (VF_CUT_NCCL_ITERS)"
  done
  fault port_down A rail0
  fault port_down A rail1
  local t0 bound=$((DOUBLE_GRACE_MS / 1000 + 30))
  t0=$(now_ms)
  local cross=(A:p0 B:p0 A:p1 B:p1)
  wait_jobs "$bound" "${cross[@]}"
  figure all_ended_s "$(awk -v ms=$(($(now_ms) - t0)) 'BEGIN {printf "%.1f", ms / 1000}')"
  for j in "${cross[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    line=$(nccl_summary "${j%%:*}" "${j#*:}")
    if [[ -z $st ]]; then
      note "$j: still running $bound s after the fault (a hang)"
      kill_job "${j%%:*}" "${j#*:}" --stacks
      rc=1
    elif ((st == 0 || st >= 128)); then
      note "$j: exit status $st, not an error exit: ${line:-no summary line}"
      rc=1
    elif [[ $line != *" FAIL NET/IB-like : Got completion from peer "*" status="* &&
      $line != *" FAIL timeout after "* ]]; then
      note "$j: not the error plain verbs would give: ${line:-no summary line}"
      rc=1
    fi
  done
  figure exit "$(for j in "${cross[@]}"; do printf '%s=%s,' "$j" "$(job_rc "${j%%:*}" "${j#*:}")"; done)"
  # A's shims: no QP to the other host is protected once both of its rails are gone, and the
  # grace was given (the work waited for a path before the application saw the failure).
  for j in A:p0 A:p1; do
    (($(shim_log_count "${j%%:*}" "${j#*:}" "waits up to $DOUBLE_GRACE_MS ms") >= 1)) ||
      { note "$j: its shim never waited the grace for a path (no 'waits up to $DOUBLE_GRACE_MS ms' line)"; rc=1; }
    assert_stats "${j%%:*}" "${j#*:}" \
      'len([q for q in qps(s) if q["peer"] == "other_process"]) > 0' \
      'all(not q["protected"] for q in qps(s) if q["peer"] == "other_process")' || rc=1
  done
  # The ring on B alone: full count, PASS, protected throughout, no failover.
  wait_jobs "$CUT_BOUND" "${DOUBLE_LOCAL_JOBS[@]}" || true
  for j in "${DOUBLE_LOCAL_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    line=$(nccl_summary "${j%%:*}" "${j#*:}")
    if [[ $st != 0 || $line != *" PASS "* ]]; then
      note "$j (B alone): status ${st:-running}: ${line:-no summary line}"
      [[ -n $st ]] || kill_job "${j%%:*}" "${j#*:}" --stacks
      rc=1
    fi
    assert_stats "${j%%:*}" "${j#*:}" 'totals(s)["failovers"] == 0' \
      'len(qps(s)) > 0 and all(q["protected"] for q in qps(s))' || rc=1
  done
  return "$rc"
}
