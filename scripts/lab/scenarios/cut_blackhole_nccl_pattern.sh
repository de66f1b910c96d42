# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover on a silent failure: nccl_pattern rings (4 processes, process 0 on rxe0, process 1 on
# rxe1) between the hosts with the shim on every process; A's rail 0 becomes a black hole (tc
# drops everything it sends and receives; its port stays ACTIVE, no event on either host) after
# traffic has run a few seconds. Only the requests' transport retries running out
# (RETRY_EXC_ERR, about 0.5 s at the shim's timeout and retry count) tell the shims; every
# process must finish (exit 0, full count) and the stats must show the failover, detected by
# error completions on at least one side. The black hole stays to the end, and rail 0's port
# stays ACTIVE, so a re-arm would succeed: the shims hold the silently failed path down (10 s,
# then 20, then 40: docs/design.md §5d step 7) and fail back onto it at most once per hold, each
# time detecting it again. Without the hold a QP fails back right after every failover (the fake's
# silent cut did so twice in one second), so at most 3 failbacks per QP in the up to 95 s of
# traffic after the fault. cut_blackhole_nccl_pattern@noshim is its control: without the shim it
# must break (rxe retries without end at NCCL's retry_cnt 7: the ring 0 processes hang).
SCENARIO_DESC="blackhole A rail0 mid nccl_pattern (no port event), shim: all exit 0 with full counts, failover on RETRY_EXC, failbacks onto the dead rail only once per hold-down"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  local rc=0 h
  cut_scenario nccl_pattern blackhole || rc=1
  [[ $SCEN_VARIANT == shim ]] || return "$rc"
  for h in A B; do
    assert_stats "$h" p0 'max(q["failbacks"] for q in qps(s)) <= 3' || rc=1
  done
  # No port event anywhere: the first side to see its requests' retries run out starts the
  # switch (the other follows with peer_request), so one host at least shows error_completion.
  local detected=0
  for h in A B; do
    _failover_stats check "$SCEN_DIR" "$h" p0 \
      --expect 'any(e["reason"] == "error_completion" for q in qps(s) for e in q["events"])' \
      >/dev/null && detected=1
  done
  ((detected)) || { note "process 0 has no failover detected by an error completion on either host"; rc=1; }
  return "$rc"
}
