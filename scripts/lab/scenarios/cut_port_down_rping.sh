# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: rping (librdmacm QPs, completion channel, verified pings) between the hosts with the shim on every process; port down of A's rail 0
# mid-run. The client must verify every ping and exit 0, and its stats must show the failover;
# the server is stopped at the end (rdma_cm's disconnect request travels over the cut rail and
# rdma_cm is not protected: see _cut.sh). cut_port_down_rping@noshim is its control.
SCENARIO_DESC="port_down A rail0 mid rping, shim: the client verifies every ping and exits 0, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rping port_down
}
