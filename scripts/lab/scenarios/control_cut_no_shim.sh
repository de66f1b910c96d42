# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Control: what the project exists to fix. Rail 0 is cut (seen by host A only) 6 s into an
# ib_write_bw of ~20 s without the shim. Expected: the traffic does not survive; a side fails or
# hangs until it is killed (figures A= and B= say which: an exit status or "hung"). If both sides
# finish with status 0 the lab did not really inject the fault, and that must FAIL: a control
# that cannot fail proves nothing.
SCENARIO_DESC="rail 0 cable cut on A mid ib_write_bw, no shim: traffic must break (expected failure)"
SCENARIO_KIND=control
SCENARIO_SHIM=none
SCENARIO_EXPECT=fail
SCENARIO_TIMEOUT=150

scenario_run() {
  # Iterations, not -D: in duration mode perftest stops at the deadline without reaping the
  # outstanding work requests and reports success even when the link died underneath it.
  local args=(-d rxe0 -x 1 -s 65536 -n 3000 -p "$LAB_PORT" "${PERFTEST_OPTS[@]}")
  # Line-buffered so that the report header (printed as traffic starts) reaches the log at once.
  app B srv -- stdbuf -oL ib_write_bw "${args[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "ib_write_bw server on B is not listening on $LAB_PORT"
  app A cli -- stdbuf -oL ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
  wait_log A cli '#bytes' 30 || lab_fail "ib_write_bw traffic did not start"
  after_seconds 6

  local a_state b_state
  fault cable_cut A rail0
  # Both sides get one common deadline; a side that still works ends within seconds of the other.
  wait_jobs 30 A:cli B:srv
  a_state=$(job_rc A cli)
  b_state=$(job_rc B srv)
  [[ -n $a_state ]] || a_state=hung
  [[ -n $b_state ]] || b_state=hung
  kill_job A cli
  kill_job B srv
  figure A "$a_state"
  figure B "$b_state"
  if [[ $a_state == 0 && $b_state == 0 ]]; then
    note "both sides finished with status 0: the cut did not break the traffic"
    return 0
  fi
  note "A: $a_state, B: $b_state (as the control expects, the traffic did not survive)"
  return 1
}
