#!/usr/bin/env bash
# One exactly-once failover check on the fake fabric (tests/failover/exactly_once.c).
#   run_exactly_once.sh shim   SCENARIO [program args]  -> must PASS with the shim preloaded, and
#                                                          the shim's stats file must show a
#                                                          failover of both QPs (--srq: of the
#                                                          second pair A2/B2 on the SRQs too)
#   run_exactly_once.sh noshim SCENARIO [program args]  -> the same cut WITHOUT the shim must
#                                                          break the traffic (exit 1, FAIL lines;
#                                                          a SETUP failure proves nothing)
#   run_exactly_once.sh plain  SCENARIO [program args]  -> WITHOUT the shim, must PASS (for the
#                                                          no_cut scenario: the traffic and the
#                                                          checker are sane on the fake itself)
#   run_exactly_once.sh selftest                        -> the checker catches duplicates/losses
# Environment (set by ctest): VF_PROGRAM, VF_SHIM, VF_FAKE_LIB_DIR, VF_WORK; optional:
# VF_RUN_TIMEOUT (seconds, default 60), VF_MIN_FAILOVERS and VF_MIN_FAILBACKS (what the stats
# must show per QP, default 1 and 0).
set -euo pipefail
mode=$1; shift
: "${VF_PROGRAM:?}" "${VF_FAKE_LIB_DIR:?}" "${VF_WORK:?}"
name="$mode"; [ $# -gt 0 ] && name="${mode}_$(echo "$*" | tr -c 'A-Za-z0-9_\n' '_')"
work="$VF_WORK/$name"
rm -rf "$work"; mkdir -p "$work"
out="$work/out.txt"; log="$work/shim.log"

fail() { echo "FAIL [$name]: $*"; echo "--- program output"; cat "$out" 2>/dev/null || true
         if [ -s "$log" ]; then echo "--- shim log (tail)"; tail -n 80 "$log"; fi; exit 1; }
# A hang is a failure, never a stuck CI (the program's own waits are bounded too).
run() { timeout --kill-after=5 "${VF_RUN_TIMEOUT:-60}" "$@"; }

case "$mode" in
  selftest)
    run "$VF_PROGRAM" selftest >"$out" 2>&1 || fail "the checker does not catch what it must"
    grep -q "^PASS selftest" "$out" || fail "no PASS line"
    cat "$out"
    ;;
  shim)
    : "${VF_SHIM:?}"
    status=0
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=info \
      VERBS_FAILOVER_LOG_FILE="$log" VERBS_FAILOVER_STATS="$work/stats.%p.json" \
      "$VF_PROGRAM" "$@" >"$out" 2>&1 || status=$?
    [ "$status" -eq 0 ] || fail "exit status $status"
    grep -q "^PASS scenario" "$out" || fail "no PASS line"
    # Every fake device flushes the drain marker (with --rxe-flush only once the shim moves the
    # QP to ERR again): a drain that gave up waiting for it counted without proof.
    if [ -f "$log" ] && grep -E "does not flush a receive posted to a QP in ERR|receive queue did not flush" "$log"; then
      fail "a switch's drain gave up waiting for the old path's receive queue to flush"
    fi
    qpns=$(sed -n 's/^QPN A=\([0-9]*\) B=\([0-9]*\)$/A=\1 B=\2/p' "$out")
    [ -n "$qpns" ] || fail "no QPN line"
    if [[ " $* " == *" --srq "* ]]; then
      # The second pair shares the SRQs: moving an SRQ moves every QP on it, so A2/B2 must show
      # a failover too. The stats file lists every QP the engine saw (protected or not).
      qpns2=$(sed -n 's/^QPN A2=\([0-9]*\) B2=\([0-9]*\)$/A2=\1 B2=\2/p' "$out")
      [ -n "$qpns2" ] || fail "no QPN line for the second pair (--srq)"
      qpns="$qpns $qpns2"
    fi
    files=("$work"/stats.*.json)
    stats=${files[0]}
    [ -f "$stats" ] || fail "the shim wrote no stats file"
    # --silent-cut: fake0 keeps dropping to the end and its port stays up, so a re-arm would
    # succeed (it needs only the port and the control channel) and a failback would land on the
    # dead path again: the shim must hold the silently failed path down instead.
    silent=0
    [[ " $* " == *" --silent-cut "* ]] && silent=1
    python3 - "$stats" "$silent" $qpns <<'PY' || fail "stats check failed ($stats)"
import json, os, sys
doc = json.load(open(sys.argv[1]))
min_failovers = int(os.environ.get("VF_MIN_FAILOVERS", "1"))
min_failbacks = int(os.environ.get("VF_MIN_FAILBACKS", "0"))
silent = sys.argv[2] == "1"
sides = []  # NAME=qpn arguments: A, B (and A2, B2 with --srq)
want = {}
for arg in sys.argv[3:]:
    side, qpn = arg.split("=")
    sides.append(side)
    want[int(qpn)] = side
seen = {}
for qp in doc["qps"]:
    if qp["qpn"] in want:
        seen[want[qp["qpn"]]] = qp
ok = True
for side in sides:
    qp = seen.get(side)
    if qp is None:
        print(f"stats: QP {side} is missing from the stats file"); ok = False; continue
    print(f"stats: QP {side} qpn={qp['qpn']} protected={qp['protected']} path={qp['path']} "
          f"failovers={qp['failovers']} failbacks={qp['failbacks']} replayed_wrs={qp['replayed_wrs']} "
          f"synthesized={qp['synthesized_completions']} "
          f"hidden_errors={qp['hidden_error_completions']}")
    # Both ends of every pair are QPs of this one process (A's peer is B, never A itself).
    if qp.get("peer") != "this_process":
        print(f"stats: QP {side} has peer {qp.get('peer')!r}, not 'this_process'")
        ok = False
    if qp["failovers"] < min_failovers:
        why = qp.get("unprotected_reason") or ""
        print(f"stats: QP {side} has {qp['failovers']} failover(s), fewer than {min_failovers}"
              + (f" (unprotected: {why})" if why else ""))
        ok = False
    if qp["failbacks"] < min_failbacks:
        print(f"stats: QP {side} has {qp['failbacks']} failback(s), fewer than {min_failbacks}")
        ok = False
    if silent and (qp["failbacks"] != 0 or qp["path"] != "standby"):
        print(f"stats: QP {side} failed back {qp['failbacks']} time(s) onto the silently dead "
              f"path (now on the {qp['path']} path)")
        ok = False
sys.exit(0 if ok else 1)
PY
    cat "$out"
    ;;
  noshim)
    status=0
    run env -u LD_PRELOAD LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" "$VF_PROGRAM" "$@" >"$out" 2>&1 || status=$?
    grep -q "^SETUP:" "$out" && fail "the cut point could not be set up (proves nothing)"
    [ "$status" -eq 1 ] || fail "without the shim the cut must break the traffic (exit 1), got exit $status"
    grep -q "^FAIL: \[" "$out" || fail "no FAIL line explains the breakage"
    echo "expected failure without the shim:"; grep -m 5 "^FAIL: \[" "$out"
    ;;
  plain)
    status=0
    run env -u LD_PRELOAD LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" "$VF_PROGRAM" "$@" >"$out" 2>&1 || status=$?
    [ "$status" -eq 0 ] || fail "without the shim and without a cut the run must PASS, got exit $status"
    grep -q "^PASS scenario" "$out" || fail "no PASS line"
    cat "$out"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
