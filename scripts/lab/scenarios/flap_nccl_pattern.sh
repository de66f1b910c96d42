# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 4 (flap_*), under the NCCL-pattern workload: the crossed-rails rings of
# heal_crossed_rails, and A's rail 0 port down and back three times while they run, each time
# waited for until process 0 has failed over and back on both hosts and process 1 is protected
# again (scripts/lab/scenarios/_heal_rings.sh). Every process must PASS (every byte and completion
# checked), and every QP of process 0 to the other host must show >= 3 failovers and >= 3
# failbacks, ending on rail 0, protected; process 1 never moves.
SCENARIO_DESC="port_down A rail0 and restore, three times, mid both nccl_pattern rings: p0 fails over and back each time, all PASS"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=600

# shellcheck source=scripts/lab/scenarios/_heal_rings.sh
source "$LAB_DIR/scenarios/_heal_rings.sh"

FLAP_NCCL_ITERS=${VF_FLAP_NCCL_ITERS:-700}  # x 128 KiB per ring: long enough for three heals

scenario_run() {
  heal_rings 3 "$FLAP_NCCL_ITERS"
}
