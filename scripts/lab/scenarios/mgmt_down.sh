# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 7, loss of the management network alone: ibv_rc_pingpong between the hosts over
# rxe0 (its TCP exchange over the management network, used only at the start), protected by rxe1.
# Once both QPs are protected, A's management link goes down for good (eth0: the control
# channel's first address, over which the shims paired); 2 s later A's rail 0 goes down too. The
# switch must still happen, its messages carried over the rail addresses the shims advertised:
# both processes exit 0 with their full count and the stats of both show the failover.
SCENARIO_DESC="mgmt link of A down, then port_down A rail0 mid ibv_rc_pingpong, shim: switch over the rail addresses, both exit 0"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

# Long enough to outlast the wait for protection, the 2 s with only mgmt down, and the switch.
CUT_PINGPONG_ITERS=${VF_MGMT_PINGPONG_ITERS:-8000}

# pingpong_protected HOST JOB: the job's one QP is protected.
pingpong_protected() {
  (($(shim_log_count "$1" "$2" 'protected — standby qp') >= 1))
}

scenario_run() {
  local rc=0 j
  cut_start rc_pingpong
  for j in "${CUT_JOBS[@]}"; do
    wait_for 60 pingpong_protected "${j%%:*}" "${j#*:}" || lab_fail "$j: its QP was not protected within 60 s"
  done
  fault port_down A mgmt
  after_seconds 2
  for j in "${CUT_JOBS[@]}"; do
    [[ -z $(job_rc "${j%%:*}" "${j#*:}") ]] ||
      lab_fail "$j ended before the rail fault (status $(job_rc "${j%%:*}" "${j#*:}")): make the run longer (VF_MGMT_PINGPONG_ITERS)"
  done
  fault port_down A rail0
  wait_jobs_or_failure "$CUT_BOUND" 10 "${CUT_JOBS[@]}" || true
  for j in "${CUT_JOBS[@]}"; do
    [[ -n $(job_rc "${j%%:*}" "${j#*:}") ]] || kill_job "${j%%:*}" "${j#*:}" --stacks
  done
  cut_workload_ok rc_pingpong || rc=1
  # The fault mattered: the first switch request went into the dead management session, and a
  # repeat (on every route) carried it.
  local repeats
  repeats=$(($(shim_log_count A cli 'no answer to its switch request .* sent again') +
    $(shim_log_count B srv 'no answer to its switch request .* sent again')))
  figure repeats "$repeats"
  ((repeats >= 1)) || { note "no switch request was repeated: the management session was not in the way"; rc=1; }
  for j in "${CUT_JOBS[@]}"; do
    assert_failover "${j%%:*}" "${j#*:}" || rc=1
  done
  failover_figures A
  return "$rc"
}
