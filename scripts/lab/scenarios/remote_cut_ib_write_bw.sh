# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 3, the peer's failure: ib_write_bw -d rxe0 -x 1 between the hosts (A the client
# that drives the traffic), and the cut on the *server's* host: B's rail 0 port down. A's own port
# stays ACTIVE; its requests are lost on the wire. B's shim sees the port go down and asks A's shim,
# over the control channel, to move the pair; both must move and finish (exit 0, full count), the
# stats of both must show the failover. Figures: B's fault-to-resume (B's clock), and
# peer_request_ms: on A, from B's request arriving to A's first completion on the standby.
# remote_cut_ib_write_bw@noshim is the control: without the shim the same cut must break.
SCENARIO_DESC="port_down B rail0 mid ib_write_bw driven by A, shim: both exit 0 with full counts, both fail over"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_NOSHIM=yes
SCENARIO_TIMEOUT=420

# shellcheck source=scripts/lab/scenarios/_cut.sh
source "$LAB_DIR/scenarios/_cut.sh"

scenario_run() {
  remote_cut_scenario ib_write_bw cli
}
