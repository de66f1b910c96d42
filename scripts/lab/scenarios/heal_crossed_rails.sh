# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# The link heals (docs/design.md §5d, steps 7 and "The idle path's port"): the crossed-rails
# rings of crossed_rails (process 0 on rail 0 backed by rail 1, process 1 the reverse), rail 0's
# port goes down on A mid-run and comes back while the rings still run. Then:
#   - process 0 fails over to rail 1 and, once rail 0 is ACTIVE again and re-armed, every one of
#     its QPs on both hosts fails back to rail 0 (failbacks >= 1, on the primary path, protected);
#   - process 1 never moves; its QPs, unprotected while their standby rail was down (on B too,
#     told by A's shim), are re-armed and protected again on both hosts.
# All four processes must exit 0 with PASS (every byte and completion checked), and the rings
# must still have been running when all of that had happened (else the run was too short: a
# set-up failure, not a pass). With the shim only: without it the cut alone breaks ring 0
# (crossed_rails@noshim).
#
# It was left out of `lab all` for a while after two stalls. The local one came with an emulated
# NIC that stopped transmitting on the path meant to survive; the one in the CI of 0445b3f left no
# kernel log, but its signature (B's VM stopped answering, its process could not be ended) is the
# one such a hang showed since. The runner now notes a hung NIC and runs the scenario once more
# (docs/lab.md, "When a run stalls").
SCENARIO_DESC="port_down A rail0 then restore, mid both nccl_pattern rings: p0 fails over and back, p1 protected again on both hosts"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_TIMEOUT=480

# shellcheck source=scripts/lab/scenarios/_heal_rings.sh
source "$LAB_DIR/scenarios/_heal_rings.sh"

HEAL_ITERS=${VF_HEAL_NCCL_ITERS:-300}  # x 128 KiB per ring: 40-190 s under emulation

scenario_run() {
  heal_rings 1 "$HEAL_ITERS"
}
