# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# The shim's port monitor on a real rxe port, and what the application sees of it. A program
# (ibv_asyncwatch) opens rxe1 under the shim; rxe1 goes down and comes back, twice:
#  1. rxe1 without a backup (VERBS_FAILOVER_PAIRS names only rxe0:rxe1): the shim logs the DOWN
#     and ACTIVE from its own context, and the application still gets its own PORT_ERR and
#     PORT_ACTIVE (the monitor steals nothing from an unprotected port);
#  2. rxe1 backed by rxe0 (the automatic pairing): the shim logs both changes and hides the
#     protected port's PORT_ERR/PORT_ACTIVE from the application (they are the shim's business).
SCENARIO_DESC="shim sees rxe1 go DOWN/ACTIVE; an unprotected port's events reach the app, a protected port's are hidden"
SCENARIO_KIND=baseline
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=180

# shim_logged JOB REGEX: the shim's log of that job (app() names it JOB.vf.<pid>.log) has a match.
shim_logged() {
  grep -qsE -- "$2" "$SCEN_DIR"/A/"$1".vf.*.log
}

# flap JOB: rail 1 of A down, then restored, each seen by the shim within a bounded time.
flap() {
  local job=$1 rc=0
  fault port_down A rail1
  wait_for 10 shim_logged "$job" 'info: port rxe1/1 is DOWN' || { note "$job: the shim did not report rxe1 DOWN"; rc=1; }
  fault restore A rail1
  wait_for 20 shim_logged "$job" 'info: port rxe1/1 is ACTIVE' || { note "$job: the shim did not report rxe1 ACTIVE"; rc=1; }
  return "$rc"
}

scenario_run() {
  local rc=0
  # The shim logs to its own file: a second writer appending to the job's log over 9p can
  # overwrite the program's lines (seen with VERBS_FAILOVER_LOG_FILE=/dev/stderr).
  app A open VERBS_FAILOVER_LOG=info VERBS_FAILOVER_PAIRS=rxe0:rxe1 -- stdbuf -oL ibv_asyncwatch -d rxe1
  wait_log A open 'async event FD' 30 || lab_fail "ibv_asyncwatch did not start on A"
  flap open || rc=1
  wait_log A open 'PORT_ERR' 10 || { note "unprotected port: the application did not get PORT_ERR"; rc=1; }
  wait_log A open 'PORT_ACTIVE' 10 || { note "unprotected port: the application did not get PORT_ACTIVE"; rc=1; }
  shim_logged open 'warn: failover: rxe1/1 has no usable backup port' ||
    { note "the shim did not say rxe1 runs unprotected"; rc=1; }
  kill_job A open

  app A hidden VERBS_FAILOVER_LOG=info -- stdbuf -oL ibv_asyncwatch -d rxe1
  wait_log A hidden 'async event FD' 30 || lab_fail "ibv_asyncwatch did not start on A"
  flap hidden || rc=1
  # The hiding happens inside the application's own ibv_get_async_event: once the shim says it
  # dropped both events, the application's log must not hold them.
  wait_for 10 shim_logged hidden 'hid port active of rxe1/1' || { note "the shim did not hide PORT_ACTIVE"; rc=1; }
  shim_logged hidden 'hid port error of rxe1/1' || { note "the shim did not hide PORT_ERR"; rc=1; }
  if grep -qsE 'PORT_ERR|PORT_ACTIVE' "$SCEN_DIR/A/hidden.log"; then
    note "protected port: the application got a port event the shim should have hidden"
    rc=1
  fi
  kill_job A hidden
  figure shim_port_lines "$(cat "$SCEN_DIR"/A/*.vf.*.log 2>/dev/null | grep -c 'info: port rxe1/1' || true)"
  return "$rc"
}
