# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: rdma-core's SRQ ping-pong between the hosts over rail 0: 16 RC QPs (ibv_srq_pingpong's
# default -q) whose receives all come from one shared receive queue; -n counts the exchanges of
# all the QPs together; -c checks the received data (a bad buffer is only printed, the exit status
# stays 0, so the client's log is checked for it).
SCENARIO_DESC="ibv_srq_pingpong, rxe0, GID 1, 16 QPs on one SRQ, 1000 x 4 KiB, -c; both sides exit 0 with 1000 iters"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=120

scenario_run() {
  local iters=1000
  local args=(-d rxe0 -g 1 -p "$LAB_PORT" -n "$iters" -s 4096 -c)
  app B srv -- ibv_srq_pingpong "${args[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "ibv_srq_pingpong server on B is not listening on $LAB_PORT"
  app A cli -- ibv_srq_pingpong "${args[@]}" "$(ip_of B mgmt)"
  local rc=0
  wait_jobs 60 A:cli B:srv || rc=1
  # "1000 iters in 2.01 seconds = 2010.00 usec/iter", printed by both sides.
  local got usec
  read -r got usec < <(awk '/iters in .* usec\/iter/ {print $1, $(NF-1)}' "$SCEN_DIR/A/cli.log")
  [[ -n ${got:-} ]] && figure iters "$got"
  [[ -n ${usec:-} ]] && figure usec_per_iter "$usec"
  if ((rc)); then
    note "ibv_srq_pingpong: client rc=$(job_rc A cli) server rc=$(job_rc B srv)"
    return 1
  fi
  local j
  for j in A:cli B:srv; do
    grep -q "^$iters iters in " "$SCEN_DIR/${j%%:*}/${j#*:}.log" || {
      note "ibv_srq_pingpong: $j did not report $iters iterations"
      rc=1
    }
  done
  if grep -q 'invalid data in page' "$SCEN_DIR/A/cli.log"; then
    note "ibv_srq_pingpong: the client's -c check printed 'invalid data in page'"
    rc=1
  fi
  return "$rc"
}
