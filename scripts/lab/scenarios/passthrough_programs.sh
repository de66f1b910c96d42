# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Exact pass-through on real rxe devices (the foundation issue's preload tests, on real hardware):
# the project's test programs run on host A without and with the shim, and must observe the same
# completions, fields and data; every function the provider publishes must be served by the shim
# (dladdr), and librdmacm's own verbs calls must reach it (trace with caller stacks).
SCENARIO_DESC="datapath/NCCL-loader/linked programs on rxe0 with and without the shim: identical transcripts"
SCENARIO_KIND=baseline
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=240

scenario_run() {
  local bin shim_name=libverbs_failover.so rc=0 a="$SCEN_DIR/A"
  bin=$(cd "$(dirname "$VF_SHIM")/../bin" && pwd) || lab_fail "no test programs beside $VF_SHIM"
  [[ -x $bin/vf_datapath_program ]] || lab_fail "vf_datapath_program not built in $bin"
  local dp=("$bin/vf_datapath_program" --dev-a rxe0 --dev-b rxe0 --gid-index 1)

  # 1. Data path (ops tables, extended verbs, ibv_wr_*, completion channel) on one port: the QP
  #    pair loops back inside rxe0.
  run_on A dp_direct 60 -- "${dp[@]}" || { note "datapath without the shim failed"; rc=1; }
  run_on A dp_shim 60 LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=trace \
    VERBS_FAILOVER_LOG_FILE="$a/dp_shim.trace.log" -- "${dp[@]}" ||
    { note "datapath under the shim failed"; rc=1; }
  if ! diff -u <(grep -v -e '^OPS ' -e '^# ' "$a/dp_direct.log") \
    <(grep -v -e '^OPS ' -e '^# ' "$a/dp_shim.log") >"$a/dp.diff"; then
    note "transcripts differ with the shim (see A/dp.diff)"
    rc=1
  fi
  local ops
  ops=$(grep -c "^OPS .* $shim_name\$" "$a/dp_shim.log" || true)
  if [[ $ops -lt 13 ]] || awk -v want="$shim_name" '/^OPS / && $NF != want {bad = 1} END {exit !bad}' "$a/dp_shim.log"; then
    note "not every published function is the shim's ($ops OPS lines)"
    rc=1
  fi
  if grep -q "^OPS .* $shim_name\$" "$a/dp_direct.log"; then
    note "the direct run reports shim functions: the check cannot tell the runs apart"
    rc=1
  fi
  local verb
  for verb in ibv_post_send ibv_post_recv ibv_poll_cq ibv_req_notify_cq ibv_create_qp_ex ibv_wr_complete; do
    grep -q "trace: $verb(" "$a/dp_shim.trace.log" || { note "no trace of $verb"; rc=1; }
  done
  figure transcript_lines "$(grep -vc -e '^OPS ' -e '^# ' "$a/dp_shim.log")"
  figure shim_ops "$ops"

  # 2. NCCL's loading pattern finds the shim for every verb and sees the same devices.
  run_on A nccl_shim 30 LD_PRELOAD="$VF_SHIM" -- "$bin/vf_nccl_loader" --expect "$shim_name" ||
    { note "NCCL-pattern loader did not get the shim's verbs"; rc=1; }
  run_on A nccl_direct 30 -- "$bin/vf_nccl_loader" --expect libibverbs >/dev/null || true
  [[ $(grep '^DEVICES' "$a/nccl_shim.log") == "DEVICES 2" &&
    $(grep '^DEVICES' "$a/nccl_direct.log") == "DEVICES 2" ]] ||
    { note "device count differs: $(grep '^DEVICES' "$a/nccl_shim.log") vs $(grep '^DEVICES' "$a/nccl_direct.log")"; rc=1; }

  # 3. librdmacm creates the QP itself: its calls must be in the shim's trace, made by librdmacm.
  local addr
  addr=$(ip_of B rail0)
  on B rping_srv -- rping -s -a "$addr" -p "$LAB_PORT" -C 20 -S 512
  wait_cm_listen B "$addr" 30 || lab_fail "rping server on B is not listening on $addr"
  run_on A rping_cli 60 LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=trace VERBS_FAILOVER_BACKTRACE=1 \
    VERBS_FAILOVER_LOG_FILE="$a/rping.trace.log" -- rping -c -a "$addr" -p "$LAB_PORT" -C 20 -S 512 -V ||
    { note "rping under the shim failed"; rc=1; }
  wait_job B rping_srv 30 >/dev/null || { note "rping server failed"; rc=1; }
  grep -Eq "trace: ibv_create_qp(_ex)?\(.*caller:.*librdmacm" "$a/rping.trace.log" ||
    { note "no ibv_create_qp made by librdmacm in the trace"; rc=1; }
  grep -q "trace: ibv_post_send(" "$a/rping.trace.log" || { note "no ibv_post_send of rping traced"; rc=1; }
  figure rping_traced_calls "$(grep -c 'trace:' "$a/rping.trace.log" || true)"
  return "$rc"
}
