# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: ib_write_bw -d rxe0 -x 1, 1000 x 64 KiB between the hosts with the shim on every
# process; port down (ip link down) of A's rail 0, after traffic has run a few seconds. Every
# process must finish (exit 0, full count) and the shim's stats must show the failover
# (scripts/lab/scenarios/_cut.sh, docs/lab.md). cut_port_down_ib_write_bw@noshim is its control: the
# same without the shim must break.
SCENARIO_DESC="port_down A rail0 mid ib_write_bw, shim: all exit 0 with full counts, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=all
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario ib_write_bw port_down
}
