# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Control: the nccl_pattern rings (same layout as the nccl_pattern scenario: process 0 of each host
# on rxe0, process 1 on rxe1) with host A's rail 0 cable cut a few seconds into a run that would
# otherwise take ~25 s, no shim. Ring 0 lives on that rail, so its all-reduce cannot complete:
# a process must fail (an error completion or its --timeout-s deadline) or hang. Ring 1 (rail 1)
# is not touched and should finish. If every process exits 0 the cut did not break the traffic
# and the control FAILs: a control that cannot fail proves nothing.
SCENARIO_DESC="rail 0 cable cut on A mid nccl_pattern rings, no shim: a ring-0 process must fail or hang (expected failure)"
SCENARIO_KIND=control
SCENARIO_SHIM=none
SCENARIO_EXPECT=fail
SCENARIO_TIMEOUT=150

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

scenario_run() {
  local j state all_ok=1
  start_nccl_rings 150 131072 20
  nccl_wait_started 60
  after_seconds 3
  fault cable_cut A rail0
  # A broken process ends within its 20 s deadline; an unbroken run would have finished by then
  # too, so a process still running after 45 s is hung.
  wait_jobs 45 "${NCCL_JOBS[@]}"
  for j in "${NCCL_JOBS[@]}"; do
    state=$(job_rc "${j%%:*}" "${j#*:}")
    [[ -n $state ]] || state=hung
    [[ $state == 0 ]] || all_ok=0
    kill_job "${j%%:*}" "${j#*:}"
    figure "${j/:/.}" "$state"
  done
  if ((all_ok)); then
    note "every process finished with status 0: the cut did not break the traffic"
    return 0
  fi
  note "$(grep -h -m1 '^nccl_pattern: rank [0-9] FAIL' "$SCEN_DIR"/A/p*.log "$SCEN_DIR"/B/p*.log | head -n1)"
  return 1
}
