# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: rping between the hosts with the shim on every process; port down of B's rail 0 (the
# server's host) mid-run. As cut_rping_client_side, with the fault seen only by the server's
# host: the client's shim moves because B's asks, and the server's RDMA_CM_EVENT_DISCONNECTED
# comes through the control channel while its own port is the dead one.
SCENARIO_DESC="port_down B rail0 (server's host) mid rping, shim: every ping verified, client and server exit 0, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rping port_down B
}
