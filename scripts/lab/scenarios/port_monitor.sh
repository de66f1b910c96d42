# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# The shim's port monitor on a real rxe port: a program that opens rxe1 under the shim makes the
# shim watch rxe1 from its own context; a port down and its restore must appear in the shim's log
# within a bounded time, and the program's own async events must still arrive (the monitor has a
# context of its own and steals nothing).
SCENARIO_DESC="shim port monitor sees rxe1 go DOWN and ACTIVE on A; the application's events still arrive"
SCENARIO_KIND=baseline
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=120

# shim_logged REGEX: the shim's log of the watch job (app() names it watch.vf.<pid>.log) has a match.
shim_logged() {
  grep -qsE -- "$1" "$SCEN_DIR"/A/watch.vf.*.log
}

scenario_run() {
  local rc=0
  # The shim logs to its own file: a second writer appending to the job's log over 9p can
  # overwrite the program's lines (seen with VERBS_FAILOVER_LOG_FILE=/dev/stderr).
  app A watch VERBS_FAILOVER_LOG=info -- stdbuf -oL ibv_asyncwatch -d rxe1
  wait_log A watch 'async event FD' 30 || lab_fail "ibv_asyncwatch did not start on A"
  fault port_down A rail1
  wait_for 10 shim_logged 'info: port rxe1/1 is DOWN' || { note "the shim did not report rxe1 DOWN"; rc=1; }
  wait_log A watch 'PORT_ERR' 10 || { note "the application did not get PORT_ERR"; rc=1; }
  fault restore A rail1
  wait_for 20 shim_logged 'info: port rxe1/1 is ACTIVE' || { note "the shim did not report rxe1 ACTIVE"; rc=1; }
  wait_log A watch 'PORT_ACTIVE' 10 || { note "the application did not get PORT_ACTIVE"; rc=1; }
  kill_job A watch
  figure shim_port_lines "$(cat "$SCEN_DIR"/A/watch.vf.*.log 2>/dev/null | grep -c 'info: port rxe1/1' || true)"
  return "$rc"
}
