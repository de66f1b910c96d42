# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20's soak, outside CI (`scripts/lab/lab soak MINUTES`, default 30): the NCCL-pattern
# rings (two processes per host, process 0 on rail 0 backed by rail 1, process 1 the reverse)
# run in rounds back to back while random faults hit either rail of either host: a port down,
# a cable cut or a black hole, held 3-20 s, restored, and then waited for until every QP of the
# round is back on its own rail and protected (a black hole's hold-down may take minutes), and
# 5-20 s more. One fault at a time: never both rails of one host (nor, one rail on each host,
# both paths of a ring). Every round's four processes must exit 0 with PASS (every byte and
# completion checked by nccl_pattern); the figures give the faults injected and survived, the
# switches the stats recorded, and the seed (VF_SOAK_SEED replays a run's choices).
SOAK_MINUTES=${VF_SOAK_MINUTES:-30}
SOAK_ITERS=${VF_SOAK_ITERS:-600}          # x 128 KiB per ring and round (2-6 min under TCG)
SOAK_HEAL_BOUND=${VF_SOAK_HEAL_BOUND:-660} # s: a hold-down grows to 600 s for a rail that keeps failing
SCENARIO_DESC="soak (not in all): random faults of either rail on either host during the NCCL-pattern rings for VF_SOAK_MINUTES ($SOAK_MINUTES) minutes; every round PASS"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_ALL=no
# The last fault may start just before the deadline: its hold, port wait, heal, gap, then the
# round's end (wait_jobs_or_failure 900 s) and the stops.
SCENARIO_TIMEOUT=$((SOAK_MINUTES * 60 + SOAK_HEAL_BOUND + 1200))

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

SOAK_KINDS=(port_down cable_cut blackhole)

# soak_stats HOST JOB EXPR: the expression holds for the job's stats file (silent; the shim
# rewrites the file on every change, so it says where each QP is now).
soak_stats() {
  python3 "$LAB_DIR/lib/failover_stats.py" check "$SCEN_DIR" "$1" "$2" --expect "$3" \
    >/dev/null 2>&1
}

# soak_settled: the round is over, or every QP of every process is on its own rail, protected.
soak_settled() {
  local j all_done=1
  for j in "${NCCL_JOBS[@]}"; do [[ -n $(job_rc "${j%%:*}" "${j#*:}") ]] || all_done=0; done
  ((all_done)) && return 0
  for j in "${NCCL_JOBS[@]}"; do
    soak_stats "${j%%:*}" "${j#*:}" \
      'len(qps(s)) > 0 and all(q["protected"] and q["path"] == "primary" for q in qps(s))' ||
      return 1
  done
}

soak_running() {
  local j
  for j in "${NCCL_JOBS[@]}"; do [[ -z $(job_rc "${j%%:*}" "${j#*:}") ]] || return 1; done
}

scenario_run() {
  local seed=${VF_SOAK_SEED:-$((RANDOM * 32768 + RANDOM))}
  RANDOM=$seed
  figure seed "$seed"
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  local end=$(($(date +%s) + SOAK_MINUTES * 60)) round=0 passed=0 faults=0 survived=0 rc=0
  local p j st shift_ports h rail kind hold round_faults
  while (($(date +%s) < end)); do
    round=$((round + 1))
    round_faults=0
    NCCL_JOBS=("A:r${round}p0" "B:r${round}p0" "A:r${round}p1" "B:r${round}p1")
    shift_ports=$((10 * (round % 10)))  # a new round does not wait for the last one's ports
    for p in 0 1; do
      start_nccl_ring "A:r${round}p$p" "B:r${round}p$p" "$(($(nccl_port A "$p") + shift_ports))" \
        "$(($(nccl_port B "$p") + shift_ports))" "rxe$p" "$SOAK_ITERS" 131072 60 "${env[@]}"
    done
    nccl_wait_started 90
    nccl_wait_protected 90
    while soak_running && (($(date +%s) < end)); do
      # No $RANDOM in a subshell: bash reseeds it there, and VF_SOAK_SEED would not replay.
      if ((RANDOM % 2)); then h=B; else h=A; fi
      rail=$((RANDOM % 2))
      kind=${SOAK_KINDS[RANDOM % ${#SOAK_KINDS[@]}]}
      hold=$((3 + RANDOM % 18))
      fault "$kind" "$h" "rail$rail"
      faults=$((faults + 1))
      round_faults=$((round_faults + 1))
      sleep "$hold"  # the fault's length, not a synchronisation
      fault restore "$h" "rail$rail"
      if [[ $kind != blackhole ]]; then
        wait_guest "$h" 30 port_state "rxe$rail" ACTIVE || lab_fail "rxe$rail on $h did not come back ACTIVE"
      fi
      if ! wait_for "$SOAK_HEAL_BOUND" soak_settled; then
        note "round $round: after fault $faults ($kind $h rail$rail, ${hold}s) the QPs were not all back on their own rails and protected within $SOAK_HEAL_BOUND s"
        rc=1
        break 2
      fi
      soak_running && sleep $((5 + RANDOM % 16))  # repaired for a while before the next fault
    done
    wait_jobs_or_failure 900 10 "${NCCL_JOBS[@]}"
    local states=()
    for j in "${NCCL_JOBS[@]}"; do
      st=$(job_rc "${j%%:*}" "${j#*:}")
      states+=("$j=${st:-hung}")
      kill_job "${j%%:*}" "${j#*:}"
    done
    log "round $round: $round_faults fault(s), exit ${states[*]}"
    if nccl_check_pass; then
      passed=$((passed + 1))
      survived=$((survived + round_faults))
    else
      rc=1
      note "round $round failed after $round_faults fault(s)"
      break
    fi
  done
  # A round cut short by a failed heal: its processes are stopped and counted as failed.
  for j in "${NCCL_JOBS[@]}"; do
    [[ -n $(job_rc "${j%%:*}" "${j#*:}") ]] || kill_job "${j%%:*}" "${j#*:}" --stacks
  done
  fault restore all
  figure rounds "$round"
  figure rounds_passed "$passed"
  figure faults_injected "$faults"
  figure faults_survived "$survived"
  local totals
  totals=$(python3 - "$SCEN_DIR" <<'PY'
import glob, json, sys
over = back = 0
for path in glob.glob(sys.argv[1] + "/*/stats.*.json"):
    try:
        s = json.load(open(path))
    except (OSError, ValueError):
        continue
    for q in s.get("qps", []):
        over += q.get("failovers", 0)
        back += q.get("failbacks", 0)
print(over, back)
PY
)
  figure failovers "${totals% *}"
  figure failbacks "${totals#* }"
  ((faults > 0)) || { note "no fault was injected"; rc=1; }
  return "$rc"
}
