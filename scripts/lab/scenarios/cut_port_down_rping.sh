# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: rping (librdmacm QPs, completion channel, verified pings) between the hosts with the shim on every process; port down of A's rail 0
# mid-run. Every process must finish with its full count and the stats must show the failover
# (scripts/lab/scenarios/_cut.sh). cut_port_down_rping@noshim is its control.
SCENARIO_DESC="port_down A rail0 mid rping, shim: all exit 0 with full counts, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=240

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rping port_down
}
