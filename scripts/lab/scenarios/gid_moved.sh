# shellcheck shell=bash disable=SC2034 # the SCENARIO_* settings are read by the runner
# Issue 20 item 4, gid_moved: a RoCE GID index can change after a flap. ib_write_bw between the
# hosts (one QP, -x at rail 0's IPv4 GID), protected; A's rail 0 port goes down, and while it is
# down its address is removed and added again with another address added in between, as a network
# manager or an operator's repair may do. The kernel gives the re-added address the first free slot
# of rxe0's GID table, so its GID index changes (the scenario reads both indexes from sysfs and
# fails as invalid if they are equal). Rail 0 comes back: A's shim must re-connect the primary with
# the new index and fail back. Both programs exit 0; every QP of both hosts shows a failover and a
# failback and ends on rail 0, protected; A's shim log says the GID moved. Before the fix the
# re-arm reused the application's old index: the RTR was refused (ENODATA, an empty slot) or sent
# from the filler address, and the pair stayed on the standby.
SCENARIO_DESC="port_down A rail0, its address removed and re-added at another GID index, restore, mid ib_write_bw: both exit 0, failback with the new index"
SCENARIO_KIND=failover
SCENARIO_SHIM=required
SCENARIO_ALL=yes
SCENARIO_TIMEOUT=300

GID_DURATION=70  # perftest -D: start, fault, re-add and GID reads take ~40 s under TCG, the failback
# comes 2 s (VERBS_FAILOVER_PORT_STABLE_MS) after the restore: a run that ended before it proves
# nothing, and is a failure of the scenario
GID_FILLER=198.18.9.1/32

# rail0_gid_index HOST NAME: sets GID_INDEX to the index of HOST's rail 0 IPv4 GID in rxe0's
# table (read from sysfs by a job NAME), empty when it is not there, and GID_WANT to that GID as
# sysfs prints it. Not a command substitution: the job bookkeeping of `run_on` must stay in this
# shell.
rail0_gid_index() {
  local h=$1 name=$2 addr want
  addr=$(ip_of "$h" rail0)
  # ::ffff:a.b.c.d as sysfs prints it: eight groups of four hex digits.
  want=$(IFS=. read -r a b c d <<<"$addr" && printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
  # One grep over rxe's 1024 slots (a fork per slot took 10 s under TCG): every slot in use,
  # as "PATH:GID" lines in the job's log.
  # shellcheck disable=SC2016 # expanded in the guest
  run_on "$h" "$name" 20 bash -c 'grep -Hvx 0000:0000:0000:0000:0000:0000:0000:0000 \
    /sys/class/infiniband/rxe0/ports/1/gids/*; true' || lab_fail "reading rxe0's GID table on $h failed"
  GID_INDEX=$(awk -F: -v want="$want" '$0 ~ /^\/sys/ { gid = substr($0, index($0, ":") + 1)
    if (gid == want) { n = split($1, p, "/"); print p[n]; exit } }' "$SCEN_DIR/$h/$name.log")
  GID_WANT=$want
}

scenario_run() {
  local rc=0 j before after addr
  local env=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || env+=(VERBS_FAILOVER_LOG=info)
  rail0_gid_index A gids_before
  before=$GID_INDEX
  [[ -n $before ]] || lab_fail "A's rail 0 GID is not in rxe0's table"
  figure gid_index_before "$before"
  # The application's GID index is the one of A's rail 0 address, as a user would pick it.
  local args=(-d rxe0 -x "$before" -s 65536 -D "$GID_DURATION" -p "$LAB_PORT" "${PERFTEST_OPTS[@]}")
  app B srv "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "ib_write_bw server on B is not listening on $LAB_PORT"
  app A cli "${env[@]}" -- stdbuf -oL ib_write_bw "${args[@]}" "$(ip_of B mgmt)"
  wait_log A cli '#bytes' 30 || lab_fail "ib_write_bw traffic did not start"
  wait_for 30 shim_says A cli 'protected — standby qp' || lab_fail "A's QP was never protected"
  after_seconds 2
  fault port_down A rail0
  wait_for 30 shim_says A cli 'failover primary -> standby done' ||
    lab_fail "A did not fail over after its rail 0 went down"
  addr="$(ip_of A rail0)/24"
  run_on A readd 60 bash -c "ip addr del $addr dev ${LAB_NET_IFACE[rail0]} &&
    ip addr add $GID_FILLER dev ${LAB_NET_IFACE[rail0]} &&
    ip addr add $addr dev ${LAB_NET_IFACE[rail0]}" || lab_fail "re-adding A's rail 0 address failed"
  # The kernel updates the GID table from a work queue, after the addresses changed: bounded
  # wait until the GID has left its old slot and is in another.
  wait_guest A 20 "! grep -qx $GID_WANT /sys/class/infiniband/rxe0/ports/1/gids/$before &&
    grep -qx $GID_WANT /sys/class/infiniband/rxe0/ports/1/gids/*" ||
    note "A's rail 0 GID was not in a new slot within 20 s"
  rail0_gid_index A gids_after
  after=$GID_INDEX
  figure gid_index_after "${after:-none}"
  [[ -n $after ]] || lab_fail "A's rail 0 GID did not come back after its address was re-added"
  [[ $after != "$before" ]] || lab_fail "the GID index did not change ($before): the scenario proves nothing"
  [[ -z $(job_rc A cli) && -z $(job_rc B srv) ]] ||
    lab_fail "ib_write_bw ended before the restore: the failback would not be tested (lengthen GID_DURATION)"
  fault restore A rail0
  wait_guest A 30 port_state rxe0 ACTIVE || lab_fail "rxe0 on A did not come back ACTIVE"
  for j in A:cli B:srv; do
    wait_for 60 failed_back_or_ended "${j%%:*}" "${j#*:}"
    if ! shim_says "${j%%:*}" "${j#*:}" 'failback standby -> primary done'; then
      note "$j: no failback within 60 s of the restore"
      rc=1
    fi
  done
  if ((rc)); then
    note "first re-arm failure: $(cat "$SCEN_DIR"/*/*.vf.*.log 2>/dev/null | grep -m1 -E 're-connecting the .* path failed|to the peer.s answer failed|not re-armed yet|cannot connect')"
  fi
  shim_says A cli "GID .* moved from index $before to $after" ||
    { note "A's shim never said the primary's GID moved from $before to $after"; rc=1; }
  expect_exit_zero 120 A:cli B:srv || rc=1
  for j in A:cli B:srv; do
    assert_stats "${j%%:*}" "${j#*:}" \
      'len(qps(s)) > 0 and all(q["failovers"] >= 1 and q["failbacks"] >= 1 for q in qps(s))' \
      'all(q["path"] == "primary" and q["protected"] for q in qps(s))' || rc=1
  done
  return "$rc"
}

# failed_back_or_ended HOST JOB: the job's shim says it failed back, or the job has ended.
failed_back_or_ended() {
  shim_says "$1" "$2" 'failback standby -> primary done' || [[ -n $(job_rc "$1" "$2") ]]
}
