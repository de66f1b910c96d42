#!/usr/bin/env bash
# Two processes, one per simulated host, on the fake's wire (tests/failover/two_process.c).
#   run_two_process.sh shim   SCENARIO  -> both must PASS with the shim preloaded (peer_dies:
#                                          host 0 PASSes with the ordinary error, host 1 is dead),
#                                          the shims paired over TCP (stats: peer other_process)
#                                          and, unless no_cut, both show a failover
#   run_two_process.sh plain  no_cut    -> without the shim and without a cut both must PASS
#   run_two_process.sh noshim SCENARIO  -> the same cut without the shim must break the traffic
#                                          (an error completion and exit 1 on a host, no host
#                                          passing; SETUP proves nothing)
# Environment (set by ctest): VF_PROGRAM, VF_SHIM, VF_FAKE_LIB_DIR, VF_WORK; optional
# VF_RUN_TIMEOUT (seconds, default 90).
set -euo pipefail
mode=$1 scenario=$2
: "${VF_PROGRAM:?}" "${VF_FAKE_LIB_DIR:?}" "${VF_WORK:?}"
name="two_process_${mode}_${scenario}"
work="$VF_WORK/$name"
rm -rf "$work"; mkdir -p "$work"
fabric="$name-$$-$RANDOM"

fail() {
  echo "FAIL [$name]: $*"
  for h in 0 1; do
    echo "--- host $h output"; cat "$work/out.$h" 2>/dev/null || true
    if [ -s "$work/shim.$h.log" ]; then echo "--- host $h shim log (tail)"; tail -n 60 "$work/shim.$h.log"; fi
  done
  exit 1
}

start_host() {
  local h=$1
  local -a env=(LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" VF_FAKE_VERBS_WIRE="$fabric" VF_FAKE_VERBS_HOST="$h")
  if [ "$mode" = shim ]; then
    env+=(LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=info VERBS_FAILOVER_LOG_FILE="$work/shim.$h.log"
          VERBS_FAILOVER_STATS="$work/stats.$h.json"
          VERBS_FAILOVER_CTRL_ADDRS="18800-18801@127.0.0.1" VERBS_FAILOVER_GRACE_MS=3000)
  fi
  # A hang is a failure, never a stuck CI (the program's own waits are bounded too).
  timeout --kill-after=5 "${VF_RUN_TIMEOUT:-90}" env -u LD_PRELOAD "${env[@]}" \
    "$VF_PROGRAM" "$scenario" "$h" >"$work/out.$h" 2>&1 &
  pids[$h]=$!
}

declare -a pids status
start_host 0
start_host 1
for h in 0 1; do status[$h]=0; wait "${pids[$h]}" || status[$h]=$?; done
echo "exit status: host 0 ${status[0]}, host 1 ${status[1]}"

case "$mode" in
  plain)
    for h in 0 1; do
      grep -q "^PASS scenario" "$work/out.$h" || fail "host $h did not PASS (exit ${status[$h]})"
    done
    cat "$work/out.0" "$work/out.1"
    ;;
  shim)
    grep -q "^PASS scenario" "$work/out.0" || fail "host 0 did not PASS (exit ${status[0]})"
    [ "${status[0]}" -eq 0 ] || fail "host 0 exit status ${status[0]}"
    if [[ "$scenario" == peer_dies* ]]; then
      # SIGKILL, seen through timeout(1) as 128 + 9
      [ "${status[1]}" -eq 137 ] || fail "host 1 was to die by SIGKILL, exit status ${status[1]}"
    else
      grep -q "^PASS scenario" "$work/out.1" || fail "host 1 did not PASS (exit ${status[1]})"
      [ "${status[1]}" -eq 0 ] || fail "host 1 exit status ${status[1]}"
    fi
    want_failover=1
    case "$scenario" in no_cut|peer_dies*) want_failover=0 ;; esac
    hosts="0 1"; [[ "$scenario" == peer_dies* ]] && hosts=0
    for h in $hosts; do
      qpn=$(sed -n 's/^QPN \([0-9]*\) peer.*/\1/p' "$work/out.$h")
      [ -f "$work/stats.$h.json" ] || fail "host $h's shim wrote no stats file"
      python3 - "$work/stats.$h.json" "$qpn" "$want_failover" <<'PY' || fail "host $h: stats check failed"
import json, sys
doc = json.load(open(sys.argv[1]))
qpn, want_failover = int(sys.argv[2]), sys.argv[3] == "1"
qp = next((q for q in doc["qps"] if q["qpn"] == qpn), None)
if qp is None:
    sys.exit(f"stats: QP {qpn} is missing")
print(f"stats: qpn={qpn} peer={qp.get('peer')} protected={qp['protected']} path={qp['path']} "
      f"failovers={qp['failovers']} failbacks={qp['failbacks']} replayed_wrs={qp['replayed_wrs']}")
if qp.get("peer") != "other_process":
    sys.exit(f"stats: the QP's peer is {qp.get('peer')!r}: not paired over the control channel")
if want_failover and qp["failovers"] < 1:
    sys.exit("stats: no failover")
PY
    done
    cat "$work/out.0" "$work/out.1"
    ;;
  noshim)
    cat "$work/out.0" "$work/out.1"
    grep -q "^SETUP:" "$work/out.0" "$work/out.1" && fail "the scenario could not be set up (proves nothing)"
    # The cut must break the traffic with an error completion in an application. Host 0 is cut
    # in every scenario, but where both are (crossed_cut) either may see its error first and
    # exit, and the other then fails because its peer ended: an error on one host is the proof,
    # and neither may pass.
    broken=0
    for h in 0 1; do
      grep -q "^PASS scenario" "$work/out.$h" && fail "host $h passed without the shim"
      if grep -q "^FAIL: \[$scenario host $h\] an error completion reached the application" "$work/out.$h"; then
        [ "${status[$h]}" -eq 1 ] || fail "host $h exit status ${status[$h]}, not 1"
        broken=1
      fi
    done
    [ "$broken" -eq 1 ] || fail "without the shim the cut must break the traffic with an error completion"
    echo "expected failure without the shim"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
