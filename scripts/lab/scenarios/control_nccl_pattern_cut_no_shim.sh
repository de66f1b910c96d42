# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Control: the nccl_pattern ring (same layout as the nccl_pattern scenario) with host A's rail 0
# cable cut a few seconds into a run that would otherwise take ~15-25 s, no shim. Ring hops 0->1
# and 1->2 use that rail, so the all-reduce cannot complete: a rank must fail (an error completion
# or its --timeout-s deadline) or hang. If every rank exits 0 the cut did not break the traffic and
# the control FAILs: a control that cannot fail proves nothing.
SCENARIO_DESC="rail 0 cable cut on A mid nccl_pattern ring, no shim: a rank must fail or hang (expected failure)"
SCENARIO_KIND=control
SCENARIO_SHIM=none
SCENARIO_EXPECT=fail
SCENARIO_TIMEOUT=150

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

scenario_run() {
  local r state all_ok=1
  start_nccl_ring 60 131072 20
  for r in 0 1 2 3; do
    wait_log "${NCCL_RING_HOSTS[r]}" "rank$r" 'traffic started' 60 || lab_fail "rank $r did not start its traffic"
  done
  after_seconds 3
  fault cable_cut A rail0
  # A broken rank ends within its 20 s deadline; an unbroken run would have finished by then too,
  # so a rank still running after 45 s is hung.
  wait_jobs 45 A:rank0 B:rank1 A:rank2 B:rank3
  for r in 0 1 2 3; do
    state=$(job_rc "${NCCL_RING_HOSTS[r]}" "rank$r")
    [[ -n $state ]] || state=hung
    [[ $state == 0 ]] || all_ok=0
    kill_job "${NCCL_RING_HOSTS[r]}" "rank$r"
    figure "r$r" "$state"
  done
  if ((all_ok)); then
    note "every rank finished with status 0: the cut did not break the traffic"
    return 0
  fi
  note "$(grep -h -m1 '^nccl_pattern: rank [0-9] FAIL' "$SCEN_DIR"/A/rank*.log "$SCEN_DIR"/B/rank*.log | head -n1)"
  return 1
}
