# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Baseline: librdmacm's rping over rail 0's IP address (RDMA-CM resolves it to rxe0).
SCENARIO_DESC="rping (librdmacm) to B's rail 0 address, 100 x 1 KiB verified pings; both exit 0"
SCENARIO_KIND=baseline
SCENARIO_SHIM=both
SCENARIO_TIMEOUT=120

scenario_run() {
  local addr
  addr=$(ip_of B rail0)
  app B srv -- rping -s -a "$addr" -p "$LAB_PORT" -C 100 -S 1024
  wait_cm_listen B "$addr" 30 || lab_fail "rping server on B is not listening on $addr"
  app A cli -- rping -c -a "$addr" -p "$LAB_PORT" -C 100 -S 1024 -V -v
  local rc=0
  wait_jobs 60 A:cli B:srv || rc=1
  figure iters "$(grep -c 'ping data:' "$SCEN_DIR/A/cli.log")"
  if ((rc)); then
    note "rping: client rc=$(job_rc A cli) server rc=$(job_rc B srv)"
    return 1
  fi
}
