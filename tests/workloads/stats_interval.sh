#!/usr/bin/env bash
# VERBS_FAILOVER_STATS_INTERVAL: the shim rewrites its stats file periodically from its own
# thread (no signal from the application). A long nccl_pattern run on the fake, under the shim,
# must produce a stats file with "reason": "interval" and its protected QPs while it runs; the
# process is then killed (SIGKILL: no exit-time write can be what the test sees).
# Usage: stats_interval.sh NCCL_PATTERN_BINARY (LD_LIBRARY_PATH and LD_PRELOAD from the caller).
set -u
bin=$1
dir=$(mktemp -d)
trap 'kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
VERBS_FAILOVER_STATS="$dir/stats.%p.json" VERBS_FAILOVER_STATS_INTERVAL=0.1 \
  "$bin" --local-ranks 2 --iters 100000 --bytes 65536 --chunk-bytes 16384 --timeout-s 60 \
  >"$dir/out.log" 2>&1 &
pid=$!
file="$dir/stats.$pid.json"
deadline=$((SECONDS + 20))
until grep -qs '"reason": "interval"' "$file" && grep -qs '"protected": true' "$file"; do
  if ((SECONDS >= deadline)) || ! kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: no interval stats file with a protected QP within 20 s"
    cat "$dir/out.log"
    cat "$file" 2>/dev/null
    exit 1
  fi
  sleep 0.05  # polling a file another process writes, under a deadline
done
kill -9 "$pid"
wait "$pid" 2>/dev/null
python3 - "$file" <<'PY' || exit 1
import json, sys
stats = json.load(open(sys.argv[1]))
assert stats["reason"] == "interval", stats["reason"]
assert stats["program"] == "nccl_pattern", stats["program"]
assert stats["totals"]["protected_qps"] >= 4, stats["totals"]
print("stats_interval: OK", stats["totals"])
PY
