# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# A measurement, not a test (not in `lab all`): ib_write_bw between the hosts, alternating runs
# without and with the shim on both sides, in one boot. Figures: the median bandwidth of each and
# their ratio (shim / no shim). Under TCG emulation single runs vary a lot; the medians of
# alternating rounds are what bench/README.md records.
SCENARIO_DESC="measurement: ib_write_bw medians without/with the shim, alternating (VF_BENCH_ROUNDS, default 5)"
SCENARIO_KIND=other
SCENARIO_SHIM=required
SCENARIO_ALL=no
SCENARIO_TIMEOUT=900

scenario_run() {
  local rounds=${VF_BENCH_ROUNDS:-5} round variant port=$LAB_PORT
  local -a plain=() shimmed=()
  for ((round = 1; round <= rounds; round++)); do
    for variant in plain shim; do
      local preload=()
      [[ $variant == shim ]] && preload=(LD_PRELOAD="$VF_SHIM")
      local args=(-d rxe0 -x 1 -s 65536 -n 400 -p "$port" "${PERFTEST_OPTS[@]}")
      on B "srv$round$variant" "${preload[@]}" -- ib_write_bw "${args[@]}"
      wait_listen B "$port" 30 || lab_fail "ib_write_bw server did not listen"
      on A "cli$round$variant" "${preload[@]}" -- ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
      wait_jobs 120 "A:cli$round$variant" "B:srv$round$variant" || {
        note "round $round ($variant) failed"
        return 1
      }
      local bw
      bw=$(perftest_figure A "cli$round$variant" 4)
      [[ $bw =~ ^[0-9.]+$ ]] || { note "no bandwidth in round $round ($variant): ${bw:-none}"; return 1; }
      if [[ $variant == shim ]]; then shimmed+=("$bw"); else plain+=("$bw"); fi
      log "round $round $variant: $bw MB/s"
      port=$((port + 1))  # a fresh port: the previous server's socket may linger in TIME_WAIT
    done
  done
  local median_plain median_shim
  median_plain=$(printf '%s\n' "${plain[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  median_shim=$(printf '%s\n' "${shimmed[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  figure rounds "$rounds"
  figure no_shim_MBps "$median_plain"
  figure shim_MBps "$median_shim"
  figure ratio "$(awk -v s="$median_shim" -v p="$median_plain" 'BEGIN {printf "%.3f", s / p}')"
  note "no shim: ${plain[*]}; shim: ${shimmed[*]}"
}
