# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# The link heals (docs/design.md §5d, steps 7 and "The idle path's port"): the crossed-rails
# rings of crossed_rails (process 0 on rail 0 backed by rail 1, process 1 the reverse), rail 0's
# port goes down on A mid-run and comes back while the rings still run. Then:
#   - process 0 fails over to rail 1 and, once rail 0 is ACTIVE again and re-armed, every one of
#     its QPs on both hosts fails back to rail 0 (failbacks >= 1, on the primary path, protected);
#   - process 1 never moves; its QPs, unprotected while their standby rail was down (on B too,
#     told by A's shim), are re-armed and protected again on both hosts.
# All four processes must exit 0 with PASS (every byte and completion checked), and the rings
# must still have been running when all of that had happened (else the run was too short: a
# set-up failure, not a pass). With the shim only: without it the cut alone breaks ring 0
# (crossed_rails@noshim).
#
# It was left out of `lab all` for a while after two stalls. The local one came with an emulated
# NIC that stopped transmitting on the path meant to survive; the one in the CI of 0445b3f left no
# kernel log, but its signature (B's VM stopped answering, its process could not be ended) is the
# one such a hang showed since. The runner now notes a hung NIC and runs the scenario once more
# (docs/lab.md, "When a run stalls").
SCENARIO_DESC="port_down A rail0 then restore, mid both nccl_pattern rings: p0 fails over and back, p1 protected again on both hosts"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=480

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

HEAL_ITERS=${VF_HEAL_NCCL_ITERS:-300}  # x 128 KiB per ring: 40-190 s under emulation
HEAL_STEP=60                           # bound, in seconds, for each shim step to show in its log

# heal_done HOST JOB DONE_REGEX [BEGIN_REGEX]: at least one DONE line, and as many as BEGIN lines.
heal_done() {
  local finished begin=0
  finished=$(shim_log_count "$1" "$2" "$3")
  [[ -z ${4:-} ]] || begin=$(shim_log_count "$1" "$2" "$4")
  ((finished >= 1 && finished >= begin))
}

# heal_wait WHAT DONE_REGEX BEGIN_REGEX HOST:JOB...: every job's log shows DONE for each BEGIN
# (BEGIN empty: at least one DONE).
heal_wait() {
  local what=$1 finished=$2 begin=$3 j
  shift 3
  for j in "$@"; do
    if ! wait_for "$HEAL_STEP" heal_done "${j%%:*}" "${j#*:}" "$finished" "$begin"; then
      local seen wanted=1
      seen=$(shim_log_count "${j%%:*}" "${j#*:}" "$finished")
      [[ -z $begin ]] || wanted=$(shim_log_count "${j%%:*}" "${j#*:}" "$begin")
      note "$j: $what not seen within $HEAL_STEP s ($seen line(s) of at least $wanted)"
      return 1
    fi
    log "$j: $what"
  done
}

scenario_run() {
  local rc=0 j h st
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  start_nccl_rings "$HEAL_ITERS" 131072 40 "${env[@]}"
  nccl_wait_started 60
  nccl_wait_protected 60
  after_seconds 2
  fault port_down A rail0
  # Process 0 moved to rail 1 (each QP logs its resumed traffic); process 1 lost its standby.
  heal_wait "traffic resumed on the standby" 'traffic resumed on the standby path' 'failover primary -> standby done' A:p0 B:p0 || rc=1
  heal_wait "unprotected (its own standby port)" "unprotected — its standby path's port rxe0/1 is down" '' A:p1 || rc=1
  heal_wait "unprotected (told by A's shim)" "unprotected — the peer's end of its standby path lost its port" '' B:p1 || rc=1
  fault restore A rail0
  wait_guest A 30 port_state rxe0 ACTIVE || lab_fail "rxe0 on A did not come back ACTIVE"
  heal_wait "every failover failed back" 'failback standby -> primary done' 'failover primary -> standby done' A:p0 B:p0 || rc=1
  heal_wait "protected again" 'protected again' 'unprotected — ' A:p1 B:p1 || rc=1
  for j in "${NCCL_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    [[ -z $st ]] || lab_fail "$j ended (status $st) before the heal was complete: make the run longer (VF_HEAL_NCCL_ITERS)"
  done
  wait_jobs_or_failure 300 10 "${NCCL_JOBS[@]}"
  local states=()
  for j in "${NCCL_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    states+=("$j=${st:-hung}")
    kill_job "${j%%:*}" "${j#*:}"
  done
  figure exit "$(IFS=,; printf '%s' "${states[*]}")"
  nccl_check_pass || rc=1
  for h in A B; do
    assert_failover "$h" p0 || rc=1
    assert_stats "$h" p0 'totals(s)["failbacks"] >= 1' \
      'all(q["path"] == "primary" and q["protected"] for q in qps(s))' || rc=1
    assert_stats "$h" p1 'totals(s)["failovers"] == 0' \
      'len(qps(s)) > 0 and all(q["protected"] and q["path"] == "primary" for q in qps(s))' || rc=1
  done
  return "$rc"
}
