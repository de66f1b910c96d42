# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Self-test of the lab's fault injection, on rail 1 so that nothing else is disturbed: each kind
# of fault must have exactly the effect the failover scenarios will rely on, and each restore must
# bring the rail back. A fault scenario that silently injects nothing would make every failover
# result meaningless.
SCENARIO_DESC="fault injection self-test on rail 1: port_down, cable_cut, blackhole(_udp), flap, restore"
SCENARIO_KIND=control
SCENARIO_SHIM=none
SCENARIO_TIMEOUT=240

PING_SEQ=0
# rail1_ping HOST PEER: one ICMP echo over rail 1 (2 s budget); status 0 when it is answered.
rail1_ping() {
  PING_SEQ=$((PING_SEQ + 1))
  run_on "$1" "ping$PING_SEQ" 20 /bin/busybox ping -c 1 -W 2 "$(ip_of "$2" rail1)" >/dev/null
}

check() {
  local what=$1
  shift
  if "$@"; then
    log "ok: $what"
  else
    note "self-test: $what does not hold"
    FAILED_CHECKS=$((FAILED_CHECKS + 1))
  fi
}

scenario_run() {
  FAILED_CHECKS=0
  # Async events of A's rail 1 device, to tell faults that raise a port event from silent ones.
  on A events -- stdbuf -oL ibv_asyncwatch -d rxe1
  wait_log A events 'async event FD' 30 || lab_fail "ibv_asyncwatch did not start on A"
  check "rail 1 answers before any fault" rail1_ping A B

  fault port_down A rail1
  check "port_down: A's rxe1 is DOWN" wait_guest A 10 port_state rxe1 DOWN
  check "port_down: A got IBV_EVENT_PORT_ERR" wait_log A events 'PORT_ERR' 10
  fault restore A rail1
  check "restore: A's rxe1 is ACTIVE again" wait_guest A 20 port_state rxe1 ACTIVE
  check "restore: A got IBV_EVENT_PORT_ACTIVE" wait_log A events 'PORT_ACTIVE' 10
  check "restore: rail 1 answers" wait_for 20 rail1_ping A B

  fault cable_cut A rail1
  check "cable_cut: A's rxe1 is DOWN" wait_guest A 10 port_state rxe1 DOWN
  check "cable_cut: B's rxe1 stays ACTIVE" wait_guest B 5 port_state rxe1 ACTIVE
  check "cable_cut: A no longer answers B" eval '! rail1_ping B A'
  fault restore A rail1
  check "restore: A's rxe1 is ACTIVE again" wait_guest A 20 port_state rxe1 ACTIVE
  check "restore: rail 1 answers" wait_for 20 rail1_ping A B

  local events_before
  events_before=$(grep -c 'PORT_' "$SCEN_DIR/A/events.log")
  fault blackhole A rail1
  check "blackhole: no echo from B" eval '! rail1_ping A B'
  check "blackhole: A's rxe1 stays ACTIVE" wait_guest A 5 port_state rxe1 ACTIVE
  fault restore A rail1
  check "restore: rail 1 answers" wait_for 20 rail1_ping A B
  check "blackhole raised no port event" \
    test "$(grep -c 'PORT_' "$SCEN_DIR/A/events.log")" -eq "$events_before"

  fault blackhole_udp A rail1
  check "blackhole_udp: ICMP still passes" rail1_ping A B
  check "blackhole_udp: RoCEv2 drop rules present" \
    run_on A iptcheck 20 iptables -C INPUT -i eth2 -p udp --dport 4791 -j DROP
  fault restore A rail1
  check "restore: RoCEv2 drop rules gone" \
    eval '! run_on A iptcheck2 20 iptables -C INPUT -i eth2 -p udp --dport 4791 -j DROP'

  fault flap A rail1 2 2 port_down
  check "flap: A's rxe1 is ACTIVE after flapping" wait_guest A 20 port_state rxe1 ACTIVE
  figure port_events "$(grep -c 'PORT_' "$SCEN_DIR/A/events.log")"
  kill_job A events
  figure failed_checks "$FAILED_CHECKS"
  ((FAILED_CHECKS == 0)) || return 1
}
