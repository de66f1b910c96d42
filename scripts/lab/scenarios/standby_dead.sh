# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 1, standby_dead: a black hole on the idle standby. ib_write_bw between the hosts
# (one QP each side, protected, traffic on rail 0); A's rail 1 (every standby's path) drops every
# frame both ways with its port ACTIVE (`fault blackhole A rail1`: no port event, nothing for the
# shim to see but its own probes of the idle standby, VERBS_FAILOVER_PROBE_MS, default 1 s).
# Both shims must report their QP unprotected within STANDBY_DETECT_S of the fault, the traffic
# on rail 0 unharmed (no failover, no error); once rail 1 is restored, both must be protected
# again (re-armed after the hold, 10 s; a re-arm that still meets the black hole fails the next
# probe and is held 20 s) while the run goes on. Both programs exit 0; the stats show zero
# failovers, the QPs on the primary and protected, and probes and probe failures on A.
# Without the probes nothing notices: both QPs stay "protected" on a standby that cannot carry a
# frame, and the first failover that needs it fails.
SCENARIO_DESC="blackhole A rail1 (the idle standby) mid ib_write_bw: unprotected within the probe period, no traffic impact; restored: protected again"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_ALL=yes
SCENARIO_TIMEOUT=240

STANDBY_DURATION=45  # perftest -D: the detection (~2 s), the black hole, the hold (10 s)
# and the re-arm fit with room under TCG; a run that ended before "protected again" fails the
# scenario as invalid
STANDBY_DETECT_S=10  # probe period 1 s + ~0.5 s of retries, with emulation's slack
STANDBY_HOLE_S=4  # restored before the hold ends: its re-arm meets a sound path

scenario_run() {
  local rc=0 j h t0 t1
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  local args=(-d rxe0 -x 1 -s 65536 -D "$STANDBY_DURATION" -p "$LAB_PORT" "${PERFTEST_OPTS[@]}")
  app B srv "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "ib_write_bw server on B is not listening on $LAB_PORT"
  app A cli "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
  wait_log A cli '#bytes' 30 || lab_fail "ib_write_bw traffic did not start"
  for j in A:cli B:srv; do
    wait_for 30 shim_says "${j%%:*}" "${j#*:}" 'protected — standby qp' ||
      lab_fail "$j's QP was never protected"
  done
  after_seconds 2
  t0=$(date +%s.%N)
  fault blackhole A rail1
  for j in A:cli B:srv; do
    if ! wait_for "$STANDBY_DETECT_S" shim_says "${j%%:*}" "${j#*:}" 'unprotected — .*standby path'; then
      note "$j: not reported unprotected within $STANDBY_DETECT_S s of the black hole"
      rc=1
    fi
  done
  t1=$(date +%s.%N)
  figure detected_within_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')"
  h=$(shim_log_count A cli 'standby path failed a probe')
  figure a_probe_failures_logged "$h"
  ((h > 0)) || { note "A:cli: its shim never said its standby failed a probe"; rc=1; }
  sleep "$STANDBY_HOLE_S"  # the fault's length, not a synchronisation
  [[ -z $(job_rc A cli) && -z $(job_rc B srv) ]] ||
    lab_fail "ib_write_bw ended during the black hole: the restore would not be tested (lengthen STANDBY_DURATION)"
  fault restore A rail1
  for j in A:cli B:srv; do
    if ! wait_for 45 protected_again_or_ended "${j%%:*}" "${j#*:}" ||
      ! shim_says "${j%%:*}" "${j#*:}" 'protected again'; then
      note "$j: not protected again within 45 s of the restore"
      rc=1
    fi
  done
  expect_exit_zero 120 A:cli B:srv || rc=1
  for j in A:cli B:srv; do
    assert_stats "${j%%:*}" "${j#*:}" \
      'len(qps(s)) > 0 and all(q["failovers"] == 0 and q["failbacks"] == 0 for q in qps(s))' \
      'all(q["path"] == "primary" and q["protected"] for q in qps(s))' || rc=1
  done
  # Only A's QP sends (perftest's server of a bandwidth test leaves its QP in RTR, and its standby
  # waits there too): A probes, B learns of the dead standby from A's shim.
  assert_stats A cli 'all(q["standby_probes"] > 0 for q in qps(s))' \
    'any(q["standby_probe_failures"] >= 1 for q in qps(s))' || rc=1
  return "$rc"
}

# protected_again_or_ended HOST JOB: the job's shim says its QP is protected again, or the job
# has ended.
protected_again_or_ended() {
  shim_says "$1" "$2" 'protected again' || [[ -n $(job_rc "$1" "$2") ]]
}
