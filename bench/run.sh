#!/usr/bin/env bash
# Alternates runs with and without the shim on the fake fabric and prints the medians and the
# difference (what the shim adds per call). First checks that the shim's run exercises the
# protected path (bench/check_protected.sh); refuses to measure otherwise.
# Usage: bench/run.sh [build-dir] [rounds] [iterations]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
rounds=${2:-7}
iterations=${3:-2000000}
bench="$build/bin/vf_post_poll_bench"
fake_dir=$(dirname "$(find "$build" -path '*fake_verbs/lib/libibverbs.so.1' | head -1)")
shim="$build/lib/libverbs_failover.so"
[ -x "$bench" ] && [ -f "$shim" ] && [ -d "$fake_dir" ] || { echo "build first (scripts/test or cmake --build)"; exit 1; }
"$repo/bench/check_protected.sh" "$bench" "$fake_dir" "$shim" 10000 || { echo "run.sh: not measuring"; exit 1; }
fields=(empty_poll_ns post_send_ns send_poll_ns post_recv_ns recv_poll_ns)
labels=("ibv_poll_cq, empty CQ (per call)" "ibv_post_send, inline 8 B write" \
        "ibv_poll_cq reaping 1 signaled send wc" "ibv_post_recv" "ibv_poll_cq, per receive wc")
declare -A base shimmed
field() { sed -E "s/.*$1=([0-9.]+).*/\1/" <<<"$2"; }
for ((r = 0; r < rounds; r++)); do
  # --idle-pair: the same number of connected QPs on the fake as under the shim (its standby
  # pair), so the fake's own per-call work is alike in both runs (post_poll_bench.c says why).
  line=$(LD_LIBRARY_PATH="$fake_dir" taskset -c 0 "$bench" "$iterations" --idle-pair)
  echo "round $r no shim: $line"
  for f in "${fields[@]}"; do base[$f]+="$(field "$f" "$line") "; done
  line=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" taskset -c 0 "$bench" "$iterations")
  echo "round $r shim   : $line"
  for f in "${fields[@]}"; do shimmed[$f]+="$(field "$f" "$line") "; done
done
median() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf 'rounds=%d iterations=%d (medians, ns)\n' "$rounds" "$iterations"
for i in "${!fields[@]}"; do
  f=${fields[$i]}
  b=$(median "${base[$f]}"); s=$(median "${shimmed[$f]}")
  printf '%-40s no shim %8s  shim %8s  added %7.2f\n' "${labels[$i]}" "$b" "$s" \
    "$(awk -v a="$s" -v b="$b" 'BEGIN{print a-b}')"
done
