# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover on a silent failure under a stock program: ib_write_bw between the hosts on rail 0 with
# the shim; A's rail 0 becomes a black hole (no port event). The shims learn it from RETRY_EXC
# alone; both sides must finish with the full iteration count and show the failover.
# cut_blackhole_ib_write_bw@noshim is its control.
SCENARIO_DESC="blackhole A rail0 mid ib_write_bw (no port event), shim: full count, failover on RETRY_EXC"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario ib_write_bw blackhole
}
