# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# An ad-hoc command pair from the environment, for trying a program in the lab without writing a
# scenario file:
#   VF_PAIR_B='ib_write_bw -d rxe0 -x 1 -p $LAB_PORT' VF_PAIR_WAIT='tcp:$LAB_PORT' \
#   VF_PAIR_A='ib_write_bw -d rxe0 -x 1 -p $LAB_PORT $B_MGMT' scripts/lab/lab run pair@shim
# VF_PAIR_B starts first on host B, then VF_PAIR_WAIT is awaited (tcp:PORT, cm:ADDR, log:REGEX on
# B's output, which is line-buffered for that; empty = nothing), then VF_PAIR_A starts on host A.
# Either command may be empty. Both must exit 0 within VF_PAIR_TIMEOUT seconds (default 120).
# The commands are shell words expanded in the scenario, with $LAB_PORT, $A_MGMT, $B_MGMT,
# $A_RAIL0, $B_RAIL0, $A_RAIL1, $B_RAIL1 available; in pair@shim they run under the shim (`app`).
SCENARIO_DESC="ad-hoc: VF_PAIR_B on B, wait VF_PAIR_WAIT, VF_PAIR_A on A; both must exit 0"
SCENARIO_KIND=adhoc
SCENARIO_SHIM=both
SCENARIO_ALL=no
SCENARIO_TIMEOUT=${VF_PAIR_TIMEOUT:-120}

scenario_run() {
  local A_MGMT B_MGMT A_RAIL0 B_RAIL0 A_RAIL1 B_RAIL1
  A_MGMT=$(ip_of A mgmt) B_MGMT=$(ip_of B mgmt)
  A_RAIL0=$(ip_of A rail0) B_RAIL0=$(ip_of B rail0)
  A_RAIL1=$(ip_of A rail1) B_RAIL1=$(ip_of B rail1)
  local a_cmd=() b_cmd=() wait=${VF_PAIR_WAIT:-} jobs=()
  [[ -n ${VF_PAIR_A:-}${VF_PAIR_B:-} ]] || lab_fail "set VF_PAIR_A and/or VF_PAIR_B"
  # The user's own command line, expanded like a shell would (variables above, quoting).
  [[ -n ${VF_PAIR_B:-} ]] && eval "b_cmd=($VF_PAIR_B)"
  [[ -n ${VF_PAIR_A:-} ]] && eval "a_cmd=($VF_PAIR_A)"
  eval "wait=\"$wait\""
  local timeout=${VF_PAIR_TIMEOUT:-120}
  if ((${#b_cmd[@]})); then
    if [[ $wait == log:* ]]; then
      app B cmd -- stdbuf -oL "${b_cmd[@]}"
    else
      app B cmd -- "${b_cmd[@]}"
    fi
    jobs+=(B:cmd)
    case $wait in
      "") ;;
      tcp:*) wait_listen B "${wait#tcp:}" 60 || lab_fail "B is not listening on ${wait#tcp:}" ;;
      cm:*) wait_cm_listen B "${wait#cm:}" 60 || lab_fail "no RDMA-CM listener on ${wait#cm:} in B" ;;
      log:*) wait_log B cmd "${wait#log:}" 60 || lab_fail "B never printed /${wait#log:}/" ;;
      *) lab_fail "VF_PAIR_WAIT must be tcp:PORT, cm:ADDR or log:REGEX" ;;
    esac
  fi
  if ((${#a_cmd[@]})); then
    app A cmd -- "${a_cmd[@]}"
    jobs+=(A:cmd)
  fi
  wait_jobs $((timeout - 20 > 10 ? timeout - 20 : 10)) "${jobs[@]}" || return 1
}
