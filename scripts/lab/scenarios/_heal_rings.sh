# shellcheck shell=bash
# Shared by heal_crossed_rails and flap_nccl_pattern (a name starting with _ is not a scenario
# itself): the crossed-rails rings (process 0 on rail 0 backed by rail 1, process 1 the reverse),
# and A's rail 0 going down and coming back while they run, FLAPS times. Each time, waited for on
# the shims' logs (bounded): process 0 fails over to rail 1 on both hosts, process 1 (its standby
# rail gone) is unprotected on both hosts; after the restore every failover of process 0 fails
# back and process 1 is protected again. Then every process must exit 0 with PASS, and the stats
# must show it: docs/lab.md.

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

HEAL_STEP=60  # bound, in seconds, for each shim step to show in its log

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

# heal_rings FLAPS ITERS: the whole run (rings of ITERS x 128 KiB); status 0 when all held.
heal_rings() {
  local flaps=$1 iters=$2 rc=0 j h st flap
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  start_nccl_rings "$iters" 131072 40 "${env[@]}"
  nccl_wait_started 60
  nccl_wait_protected 60
  after_seconds 2
  for ((flap = 1; flap <= flaps; flap++)); do
    fault port_down A rail0
    # Process 0 moved to rail 1 (each QP logs its resumed traffic); process 1 lost its standby.
    heal_wait "traffic resumed on the standby" 'traffic resumed on the standby path' 'failover primary -> standby done' A:p0 B:p0 || rc=1
    heal_wait "unprotected (its own standby port)" "unprotected — its standby path's port rxe0/1 is down" '' A:p1 || rc=1
    heal_wait "unprotected (told by A's shim)" "unprotected — the peer's end of its standby path failed" '' B:p1 || rc=1
    fault restore A rail0
    wait_guest A 30 port_state rxe0 ACTIVE || lab_fail "rxe0 on A did not come back ACTIVE"
    heal_wait "every failover failed back" 'failback standby -> primary done' 'failover primary -> standby done' A:p0 B:p0 || rc=1
    heal_wait "protected again" 'protected again' 'unprotected — ' A:p1 B:p1 || rc=1
    log "flap $flap of $flaps healed"
  done
  for j in "${NCCL_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    [[ -z $st ]] || lab_fail "$j ended (status $st) before the heal was complete: make the run longer"
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
    # Every QP to the other host flapped: one failover and one failback per flap.
    assert_stats "$h" p0 \
      "all(q[\"failovers\"] >= $flaps and q[\"failbacks\"] >= $flaps for q in qps(s) if q[\"peer\"] == \"other_process\")" \
      'all(q["path"] == "primary" and q["protected"] for q in qps(s))' || rc=1
    assert_stats "$h" p1 'totals(s)["failovers"] == 0' \
      'len(qps(s)) > 0 and all(q["protected"] and q["path"] == "primary" for q in qps(s))' || rc=1
  done
  return "$rc"
}
