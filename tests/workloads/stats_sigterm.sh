#!/usr/bin/env bash
# A rank ended by SIGTERM (torchrun's teardown, scancel) runs no exit handler, yet its stats file
# must hold the failover it made: the shim rewrites VERBS_FAILOVER_STATS when what it says
# changes (at most every 0.1 s), with no VERBS_FAILOVER_STATS_INTERVAL. A long nccl_pattern run
# on the fake, fake0's port cut after 5 chunks; once the shim's log (debug) shows a failover done
# and, after it, the stats file written, the process gets SIGTERM; its file must then say
# "reason": "change" and count the failover.
# Usage: stats_sigterm.sh NCCL_PATTERN_BINARY (LD_LIBRARY_PATH and LD_PRELOAD from the caller).
set -u
bin=$1
dir=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
VERBS_FAILOVER_STATS="$dir/stats.%p.json" VERBS_FAILOVER_LOG=debug \
  VERBS_FAILOVER_LOG_FILE="$dir/vf.%p.log" \
  "$bin" --local-ranks 2 --iters 100000 --bytes 65536 --chunk-bytes 16384 --timeout-s 60 \
  --inject-port-down-after 5 >"$dir/out.log" 2>&1 &
pid=$!
file="$dir/stats.$pid.json"
log="$dir/vf.$pid.log"
# The line number of the first finished failover, and whether a stats write follows it.
written_after_failover() {
  awk '/failover primary -> standby done/ && !done {done = NR}
       done && NR > done && /stats: .* written \(change\)/ {found = 1}
       END {exit !found}' "$log" 2>/dev/null
}
deadline=$((SECONDS + 30))
until written_after_failover; do
  if ((SECONDS >= deadline)) || ! kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: no stats file written after a failover within 30 s (the shim's log below)"
    grep -E "failover|stats" "$log" 2>/dev/null | tail -20
    tail -5 "$dir/out.log"
    exit 1
  fi
  sleep 0.05  # polling a file another process writes, under a deadline
done
kill -TERM "$pid"
wait "$pid"
status=$?
pid=
if ((status != 128 + 15)); then
  echo "FAIL: nccl_pattern ended with status $status, expected $((128 + 15)) (SIGTERM)"
  tail -5 "$dir/out.log"
  exit 1
fi
python3 - "$file" <<'PY' || exit 1
import json, sys
stats = json.load(open(sys.argv[1]))
assert stats["reason"] == "change", stats["reason"]
assert stats["program"] == "nccl_pattern", stats["program"]
failovers = stats["totals"]["failovers"]
assert failovers >= 1, ("no failover in the file", stats["totals"])
print("stats_sigterm: OK, failovers", failovers, stats["totals"])
PY
