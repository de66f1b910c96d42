# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Measurement (not in `lab all`): how long traffic stops when a rail's port goes down under the
# shim: five ib_write_bw runs, in each A's rail 0 port down mid-run, then restored
# (_fault_time.sh); each fault-to-first-completion time, their median, the shim's failover ms.
SCENARIO_DESC="measurement: 5 x (ib_write_bw, port_down A rail0, restore) with the shim; fault-to-resume ms and median"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_ALL=no
SCENARIO_TIMEOUT=900

# shellcheck source=scripts/lab/scenarios/_fault_time.sh
source "$LAB_DIR/scenarios/_fault_time.sh"

scenario_run() {
  fault_time_rounds port_down
}
