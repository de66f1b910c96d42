# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Failover: rping (librdmacm QPs, completion channel, verified pings) between the hosts with the
# shim on every process; port down of A's rail 0 (the client's host) mid-run. The client must
# verify every ping and exit 0; the server must end by itself with 0, on the disconnect the shim
# carries over the control channel (rdma_cm's own request travels over the cut rail); both
# stats show the failover. cut_rping_client_side@noshim is its control.
SCENARIO_DESC="port_down A rail0 (client's host) mid rping, shim: every ping verified, client and server exit 0, stats show the failover"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  cut_scenario rping port_down
}
