# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover with crossed rails (the acceptance): two nccl_pattern processes per host, process
# 0 on rxe0 with rxe1 as backup, process 1 on rxe1 with rxe0 as backup (two 2-rank rings, A+B each).
# Rail 0's port goes down on A mid-run. Process 0 (A and B) must move to rail 1; process 1, whose
# standby was on rail 0, keeps running unprotected but unharmed, and its shim must say so in its
# stats: no failover, its QPs' backup is rxe0/1, and on A device rxe0 is reported DOWN and every
# QP unprotected, with the reason; on B, whose ports are all up, every p1 QP connected to A is
# unprotected too, because A's shim told it that its end of the standby path lost its port
# (PathStatus); B's self-connected flush QP, both of whose ends are on B, stays protected.
# All four processes must exit 0 with PASS. crossed_rails@noshim: without the shim ring 0 breaks.
SCENARIO_DESC="port_down A rail0 mid both nccl_pattern rings, shim: p0 fails over, p1 unprotected but unharmed"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  local rc=0 h
  cut_scenario nccl_pattern port_down || rc=1
  [[ $SCEN_VARIANT == shim ]] || return "$rc"
  # Process 1: its own rail (1) never failed, its backup rail (0) did.
  for h in A B; do
    assert_stats "$h" p1 \
      'totals(s)["failovers"] == 0' \
      'len(qps(s)) > 0 and all(q["backup"] == "rxe0/1" for q in qps(s))' || rc=1
  done
  # On A, whose rail 0 went down, process 1 must say its QPs are no longer protected, and why.
  assert_stats A p1 'dev(s, "rxe0").get("state") == "DOWN"' \
    'all(not q["protected"] and "standby path" in (q.get("unprotected_reason") or "") for q in qps(s))' || rc=1
  # On B the port is up; A's shim must have told B's that the standby path is gone.
  assert_stats B p1 'dev(s, "rxe0").get("state") == "ACTIVE"' \
    'len([q for q in qps(s) if q["peer"] == "other_process"]) > 0' \
    'all(not q["protected"] and "the peer'"'"'s end of its standby path" in (q.get("unprotected_reason") or "") for q in qps(s) if q["peer"] == "other_process")' \
    'any(q["peer"] == "self" for q in qps(s))' \
    'all(q["protected"] for q in qps(s) if q["peer"] == "self")' || rc=1
  return "$rc"
}
