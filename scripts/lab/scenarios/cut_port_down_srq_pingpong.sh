# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: ibv_srq_pingpong -d rxe0 -g 1 -c, 16 RC QPs sharing one SRQ, 10000 x 4 KiB between the
# hosts with the shim on every process; port down (ip link down) of A's rail 0, after traffic has
# run a few seconds. Every process must finish (exit 0, full count, no bad buffer) and the shim's
# stats must show the failover (scripts/lab/scenarios/_cut.sh, docs/lab.md).
# cut_port_down_srq_pingpong@noshim is its control: the same without the shim must break.
SCENARIO_DESC="port_down A rail0 mid srq_pingpong (16 QPs, one SRQ), shim: all exit 0 with full counts, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario srq_pingpong port_down
}
