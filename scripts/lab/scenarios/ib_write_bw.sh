# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: perftest ib_write_bw between the hosts over rail 0, small enough for emulation (~8 MB/s).
SCENARIO_DESC="perftest ib_write_bw, rxe0, GID 1, 200 x 64 KiB; both sides exit 0"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=150

scenario_run() {
  perftest_pair ib_write_bw 65536 200
}
