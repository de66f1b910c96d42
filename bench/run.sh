#!/usr/bin/env bash
# Alternates runs with and without the shim on the fake fabric and prints the medians and the
# difference (what the shim adds per call). Usage: bench/run.sh [build-dir] [rounds] [iterations]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
rounds=${2:-7}
iterations=${3:-2000000}
bench="$build/bin/vf_post_poll_bench"
fake_dir=$(dirname "$(find "$build" -path '*fake_verbs/lib/libibverbs.so.1' | head -1)")
shim="$build/lib/libverbs_failover.so"
[ -x "$bench" ] && [ -f "$shim" ] && [ -d "$fake_dir" ] || { echo "build first (scripts/test or cmake --build)"; exit 1; }
declare -a base_poll base_post shim_poll shim_post
for ((r = 0; r < rounds; r++)); do
  line=$(LD_LIBRARY_PATH="$fake_dir" taskset -c 0 "$bench" "$iterations")
  base_poll+=("$(sed -E 's/.*empty_poll_ns=([0-9.]+).*/\1/' <<<"$line")")
  base_post+=("$(sed -E 's/.*post_send_ns=([0-9.]+).*/\1/' <<<"$line")")
  line=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" taskset -c 0 "$bench" "$iterations")
  shim_poll+=("$(sed -E 's/.*empty_poll_ns=([0-9.]+).*/\1/' <<<"$line")")
  shim_post+=("$(sed -E 's/.*post_send_ns=([0-9.]+).*/\1/' <<<"$line")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
bp=$(median "${base_poll[@]}"); sp=$(median "${shim_poll[@]}")
bs=$(median "${base_post[@]}"); ss=$(median "${shim_post[@]}")
printf 'rounds=%d iterations=%d (medians, ns per call)\n' "$rounds" "$iterations"
printf 'ibv_poll_cq (empty): no shim %s  shim %s  added %.2f\n' "$bp" "$sp" "$(awk -v a="$sp" -v b="$bp" "BEGIN{print a-b}")"
printf 'ibv_post_send      : no shim %s  shim %s  added %.2f\n' "$bs" "$ss" "$(awk -v a="$ss" -v b="$bs" "BEGIN{print a-b}")"
