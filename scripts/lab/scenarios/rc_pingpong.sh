# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: the libibverbs example RC ping-pong between the hosts over rail 0.
SCENARIO_DESC="ibv_rc_pingpong, rxe0, GID 1, 200 x 4 KiB round trips; both sides exit 0"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=120

scenario_run() {
  local args=(-d rxe0 -g 1 -p "$LAB_PORT" -n 200 -s 4096)
  app B srv -- ibv_rc_pingpong "${args[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "ibv_rc_pingpong server on B is not listening on $LAB_PORT"
  app A cli -- ibv_rc_pingpong "${args[@]}" "$(ip_of B mgmt)"
  local rc=0
  wait_jobs 60 A:cli B:srv || rc=1
  # "200 iters in 0.65 seconds = 3251.21 usec/iter"
  local iters usec
  read -r iters usec < <(awk '/iters in .* usec\/iter/ {print $1, $(NF-1)}' "$SCEN_DIR/A/cli.log")
  [[ -n ${iters:-} ]] && figure iters "$iters"
  [[ -n ${usec:-} ]] && figure usec_per_iter "$usec"
  if ((rc)); then
    note "ibv_rc_pingpong: client rc=$(job_rc A cli) server rc=$(job_rc B srv)"
    return 1
  fi
  [[ ${iters:-} == 200 ]] || {
    note "ibv_rc_pingpong: client did not report 200 iterations"
    return 1
  }
}
