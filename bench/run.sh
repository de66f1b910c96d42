#!/usr/bin/env bash
# Alternates runs with and without the shim on the fake fabric and prints what the shim adds per
# call, two ways: the difference of the medians of each run's mean, and the median over rounds
# of the difference between a round's two runs of their batch medians (*_p50_ns: a run's
# median over batches of 16 calls). The second is the one to trust on a VM with steal time: a
# preempted batch does not move a batch median, and comparing the two runs of one round (a
# second apart) leaves out the machine's slower and faster minutes. First checks that the
# shim's run exercises the protected path (bench/check_protected.sh); refuses to measure
# otherwise.
# --after-failback (4th argument): both runs under the shim, one as usual and one after a failover
# and failback (post_poll_bench --after-failback): what a failback leaves on the healthy path
# (issue 19 item 11); "no shim" then reads "never failed over".
# Usage: bench/run.sh [build-dir] [rounds] [iterations] [--after-failback]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
rounds=${2:-7}
iterations=${3:-2000000}
after_failback=${4:-}
[[ -z $after_failback || $after_failback == --after-failback ]] || { echo "usage: $0 [build] [rounds] [iterations] [--after-failback]"; exit 2; }
bench="$build/bin/vf_post_poll_bench"
fake_dir=$(dirname "$(find "$build" -path '*fake_verbs/lib/libibverbs.so.1' | head -1)")
shim="$build/lib/libverbs_failover.so"
[ -x "$bench" ] && [ -f "$shim" ] && [ -d "$fake_dir" ] || { echo "build first (scripts/test or cmake --build)"; exit 1; }
"$repo/bench/check_protected.sh" "$bench" "$fake_dir" "$shim" 10000 || { echo "run.sh: not measuring"; exit 1; }
fields=(empty_poll_ns post_send_ns send_poll_ns post_recv_ns recv_poll_ns)
labels=("ibv_poll_cq, empty CQ (per call)" "ibv_post_send, inline 8 B write" \
        "ibv_poll_cq reaping 1 signaled send wc" "ibv_post_recv" "ibv_poll_cq, per receive wc")
declare -A base shimmed paired
# A leading space before each name: post_send_ns never matches inside another field's name.
field() { sed -E "s/.* $1=([0-9.]+).*/\1/" <<<" $2"; }
for ((r = 0; r < rounds; r++)); do
  # --idle-pair: the same number of connected QPs on the fake as under the shim (its standby
  # pair), so the fake's own per-call work is alike in both runs (post_poll_bench.c says why).
  if [[ -n $after_failback ]]; then
    # The port-stability wait at 0: the failback follows the port's return at once.
    plain=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" taskset -c 0 "$bench" "$iterations")
    echo "round $r never failed over: $plain"
    line=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" VERBS_FAILOVER_PORT_STABLE_MS=0 \
      taskset -c 0 "$bench" "$iterations" --after-failback)
    echo "round $r after failback   : $line"
  else
    plain=$(LD_LIBRARY_PATH="$fake_dir" taskset -c 0 "$bench" "$iterations" --idle-pair)
    echo "round $r no shim: $plain"
    line=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" taskset -c 0 "$bench" "$iterations")
    echo "round $r shim   : $line"
  fi
  for f in "${fields[@]}"; do
    base[$f]+="$(field "$f" "$plain") "
    shimmed[$f]+="$(field "$f" "$line") "
    p50=${f%_ns}_p50_ns
    paired[$f]+="$(awk -v a="$(field "$p50" "$line")" -v b="$(field "$p50" "$plain")" \
      'BEGIN{printf "%.2f", a-b}') "
  done
done
median() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf 'rounds=%d iterations=%d (ns; means: medians of the runs\x27 means; paired p50: median over rounds of shim minus no shim, batch medians)\n' \
  "$rounds" "$iterations"
for i in "${!fields[@]}"; do
  f=${fields[$i]}
  b=$(median "${base[$f]}"); s=$(median "${shimmed[$f]}")
  printf '%-40s means: no shim %8s  shim %8s  added %7.2f | paired p50 added %7.2f\n' \
    "${labels[$i]}" "$b" "$s" "$(awk -v a="$s" -v b="$b" 'BEGIN{print a-b}')" \
    "$(median "${paired[$f]}")"
done
