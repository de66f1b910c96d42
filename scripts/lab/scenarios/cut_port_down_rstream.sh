# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: rstream (librdmacm's rsockets) between the hosts with the shim on both processes; port
# down of A's rail 0 mid-run. The server waits in rpoll(), which sleeps in poll() on its
# completion channel's fd itself: the fd must wake for the standby's completions (issue 19 item
# 4a). Every process must finish with its full count and the stats must show the failover
# (scripts/lab/scenarios/_cut.sh). cut_port_down_rstream@noshim is its control.
SCENARIO_DESC="port_down A rail0 mid rstream (server in rpoll on its channel fd), shim: both exit 0 with full counts, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rstream port_down
}
