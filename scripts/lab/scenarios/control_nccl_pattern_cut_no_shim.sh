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

scenario_run() {
  local bin=$REPO_DIR/build/bin/nccl_pattern r state all_ok=1
  [[ -x $bin ]] || lab_fail "nccl_pattern is not built: $bin"
  local -a hosts=(A B A B)
  for r in 0 1 2 3; do
    local next=$(((r + 1) % 4)) prev=$(((r + 3) % 4))
    app "${hosts[r]}" "rank$r" -- stdbuf -oL "$bin" --rank "$r" --nranks 4 \
      --listen $((LAB_PORT + 100 * r)) --next "$(ip_of "${hosts[next]}" mgmt):$((LAB_PORT + 100 * next))" \
      --dev "rxe$((r / 2))" --prev-dev "rxe$((prev / 2))" --gid-index 1 --qps-per-conn 2 \
      --iters 60 --bytes 131072 --chunk-bytes 16384 --ib-timeout 14 --timeout-s 20
  done
  for r in 0 1 2 3; do
    wait_log "${hosts[r]}" "rank$r" 'traffic started' 60 || lab_fail "rank $r did not start its traffic"
  done
  after_seconds 3
  fault cable_cut A rail0
  # A broken rank ends within its 20 s deadline; an unbroken run would have finished by then too,
  # so a rank still running after 45 s is hung.
  wait_jobs 45 A:rank0 B:rank1 A:rank2 B:rank3
  for r in 0 1 2 3; do
    state=$(job_rc "${hosts[r]}" "rank$r")
    [[ -n $state ]] || state=hung
    [[ $state == 0 ]] || all_ok=0
    kill_job "${hosts[r]}" "rank$r"
    figure "r$r" "$state"
  done
  if ((all_ok)); then
    note "every rank finished with status 0: the cut did not break the traffic"
    return 0
  fi
  note "$(grep -h -m1 '^nccl_pattern: rank [0-9] FAIL' "$SCEN_DIR"/A/rank*.log "$SCEN_DIR"/B/rank*.log | head -n1)"
  return 1
}
