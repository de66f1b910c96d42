# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: ibv_rc_pingpong -e (completion channel) between the hosts with the shim on every process; port down of A's rail 0
# mid-run. Every process must finish with its full count and the stats must show the failover
# (scripts/lab/scenarios/_cut.sh). cut_port_down_rc_pingpong_events@noshim is its control.
SCENARIO_DESC="port_down A rail0 mid rc_pingpong_events, shim: all exit 0 with full counts, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rc_pingpong_events port_down
}
