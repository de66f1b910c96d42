# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 3, the peer's failure, under the NCCL-pattern workload: the rings of
# cut_port_down_nccl_pattern (process 0 of each host on rxe0, process 1 on rxe1), and the cut on B:
# B's rail 0 port down. A's ports all stay ACTIVE. B's shim detects the cut and moves both ends of
# each rail-0 QP through the control channel; every process must finish with its full count, and
# the rail-0 processes of both hosts must show the failover. Figures as in remote_cut_ib_write_bw.
SCENARIO_DESC="port_down B rail0 mid nccl_pattern, shim: all exit 0 with full counts, both ends fail over"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  remote_cut_scenario nccl_pattern p0
}
