# shellcheck shell=bash
# Shared by the cut_* failover scenarios (a name starting with _ is not a scenario itself): a
# workload between the hosts, rail 0 cut on host A mid-run, and the verdict.
#   with the shim (the scenario itself): every process exits 0 within the bound with its full
#     iteration count (perftest's result table, rc_pingpong's and srq_pingpong's "N iters",
#     nccl_pattern's PASS) AND
#     the shim's stats prove a failover: assert_failover on each process whose QPs were on rail 0.
#   without the shim (NAME@noshim, the matching control): the workload must break (a process
#     fails or hangs); the stats are not looked at.
# docs/lab.md, "Failover scenarios".

# shellcheck source=scripts/lab/scenarios/_nccl_pattern_ring.sh
source "$LAB_DIR/scenarios/_nccl_pattern_ring.sh"

# Sizes: 10-40 s of traffic on a quiet 2-core machine. Rates vary a lot between runs and
# machines under TCG emulation: ib_write_bw was seen at 16 MB/s and ib_send_bw at 1.2 MB/s (a
# host whose VMs got half their CPU: 3000 x 64 KiB then needed 148 s after the fault). The fault
# must come while the traffic runs; a run that ended before it is a set-up failure (lab_fail),
# not a pass. CUT_BOUND leaves about 3x the slowest run seen after a fault at these sizes.
CUT_PERFTEST_ITERS=${VF_CUT_PERFTEST_ITERS:-1500}  # x 64 KiB (6 s at 16 MB/s, 80 s at 1.2 MB/s)
CUT_PINGPONG_ITERS=${VF_CUT_PINGPONG_ITERS:-2000}  # x 4 KiB round trips
CUT_SRQ_ITERS=${VF_CUT_SRQ_ITERS:-10000}           # x 4 KiB, 16 QPs together (15-60 s)
CUT_RPING_COUNT=${VF_CUT_RPING_COUNT:-1500}        # x 1 KiB verified pings (~40 s)
CUT_RSTREAM_ITERS=${VF_CUT_RSTREAM_ITERS:-12}       # x 1000 x 4 KiB each way (~20-30 s)
CUT_NCCL_ITERS=${VF_CUT_NCCL_ITERS:-150}           # x 128 KiB all-reduce per ring (25-95 s)
CUT_AFTER=2    # seconds of traffic before the fault
CUT_BOUND=240  # seconds after the fault for every process to finish

# The shim's settings for every process of a cut scenario: process 0's rail 0 is backed by rail 1
# and process 1's rail 1 by rail 0 (also the shim's automatic choice; explicit here).
cut_shim_env() {
  CUT_ENV=("VERBS_FAILOVER_PAIRS=rxe0:rxe1,rxe1:rxe0")
  [[ -n ${VERBS_FAILOVER_LOG:-} ]] || CUT_ENV+=(VERBS_FAILOVER_LOG=info)
}

# cut_start WORKLOAD: starts it and waits until its traffic runs. Sets CUT_JOBS (every process)
# and CUT_PROTECTED (the processes whose QPs are on rail 0, which must fail over).
cut_start() {
  local workload=$1
  CUT_ALSO_STOP=()
  cut_shim_env
  case $workload in
    nccl_pattern)
      start_nccl_rings "$CUT_NCCL_ITERS" 131072 40 "${CUT_ENV[@]}"
      nccl_wait_started 60
      [[ $SCEN_VARIANT != shim ]] || nccl_wait_protected 60
      CUT_JOBS=("${NCCL_JOBS[@]}")
      CUT_PROTECTED=(A:p0 B:p0)
      ;;
    rping)
      # librdmacm: the QPs are created by rdma_create_qp and connected by rdma_connect; rping
      # sleeps on a completion channel. -V verifies every ping's payload.
      local addr
      addr=$(ip_of B rail0)
      app B srv "${CUT_ENV[@]}" -- stdbuf -oL rping -s -a "$addr" -p "$LAB_PORT" -C "$CUT_RPING_COUNT" -S 1024
      wait_cm_listen B "$addr" 30 || lab_fail "rping server on B is not listening on $addr"
      app A cli "${CUT_ENV[@]}" -- stdbuf -oL rping -c -a "$addr" -p "$LAB_PORT" -C "$CUT_RPING_COUNT" -S 1024 -V -v
      wait_log A cli 'ping data' 30 || lab_fail "rping did not start"
      # Both must end by themselves: the client after its last verified ping, the server when
      # rdma_cm gives it RDMA_CM_EVENT_DISCONNECTED. The CM's disconnect request travels over
      # the primary rail; with it cut, the shim carries the disconnect over the control channel
      # (issue 20 item 9, docs/design.md §5j).
      CUT_JOBS=(A:cli B:srv)
      CUT_PROTECTED=(A:cli B:srv)
      ;;
    rstream)
      # librdmacm's rsockets: the server (-T a) waits in rpoll(), which poll()s its completion
      # channel's fd itself and calls ibv_get_cq_event only once the fd is readable (issue 19 item
      # 4a: after a failover that fd must wake for the standby's completions). The client blocks
      # in rrecv/rsend: with -T a on both sides rstream fails by itself (exit 16, POLLHUP) when the
      # server's disconnect is processed before the client's last receive; seen without the shim.
      local addr sizes=(-S 4096 -C 1000 -I "$CUT_RSTREAM_ITERS")
      addr=$(ip_of B rail0)
      app B srv "${CUT_ENV[@]}" -- stdbuf -oL rstream -b "$addr" -p "$LAB_PORT" -T a "${sizes[@]}"
      wait_cm_listen B "$addr" 30 || lab_fail "rstream server on B is not listening on $addr"
      app A cli "${CUT_ENV[@]}" -- stdbuf -oL rstream -s "$addr" -p "$LAB_PORT" "${sizes[@]}"
      wait_log A cli '^name' 30 || lab_fail "rstream did not start"
      CUT_JOBS=(A:cli B:srv)
      CUT_PROTECTED=(A:cli B:srv)
      ;;
    rc_pingpong | rc_pingpong_events)
      local args=(-d rxe0 -g 1 -p "$LAB_PORT" -n "$CUT_PINGPONG_ITERS" -s 4096)
      # -e: both sides sleep on a completion channel (ibv_req_notify_cq, ibv_get_cq_event,
      # ibv_ack_cq_events) instead of busy polling.
      [[ $workload == rc_pingpong_events ]] && args+=(-e)
      app B srv "${CUT_ENV[@]}" -- stdbuf -oL ibv_rc_pingpong "${args[@]}"
      wait_listen B "$LAB_PORT" 30 || lab_fail "ibv_rc_pingpong server on B is not listening on $LAB_PORT"
      app A cli "${CUT_ENV[@]}" -- stdbuf -oL ibv_rc_pingpong "${args[@]}" "$(ip_of B mgmt)"
      wait_log A cli 'remote address' 30 || lab_fail "ibv_rc_pingpong did not connect"
      CUT_JOBS=(A:cli B:srv)
      CUT_PROTECTED=(A:cli B:srv)
      ;;
    srq_pingpong)
      # rdma-core's ibv_srq_pingpong: 16 RC QPs (its default -q) whose receives all come from one
      # shared receive queue; -n counts the exchanges of all the QPs together. -c checks the
      # received data (the client prints "invalid data in page N", and still exits 0).
      local args=(-d rxe0 -g 1 -p "$LAB_PORT" -n "$CUT_SRQ_ITERS" -s 4096 -c)
      app B srv "${CUT_ENV[@]}" -- stdbuf -oL ibv_srq_pingpong "${args[@]}"
      wait_listen B "$LAB_PORT" 30 || lab_fail "ibv_srq_pingpong server on B is not listening on $LAB_PORT"
      app A cli "${CUT_ENV[@]}" -- stdbuf -oL ibv_srq_pingpong "${args[@]}" "$(ip_of B mgmt)"
      wait_log A cli 'remote address' 30 || lab_fail "ibv_srq_pingpong did not connect"
      CUT_JOBS=(A:cli B:srv)
      CUT_PROTECTED=(A:cli B:srv)
      ;;
    ib_write_bw | ib_send_bw | ib_read_bw)
      # Iterations, not -D: in duration mode perftest stops at the deadline without reaping its
      # outstanding work requests and reports success even when the link died (docs/lab.md).
      local args=(-d rxe0 -x 1 -s 65536 -n "$CUT_PERFTEST_ITERS" -p "$LAB_PORT" "${PERFTEST_OPTS[@]}")
      app B srv "${CUT_ENV[@]}" -- stdbuf -oL "$workload" "${args[@]}"
      wait_listen B "$LAB_PORT" 30 || lab_fail "$workload server on B is not listening on $LAB_PORT"
      app A cli "${CUT_ENV[@]}" -- stdbuf -oL "$workload" "${args[@]}" "$(ip_of B mgmt)"
      # The report header is printed as the traffic starts.
      wait_log A cli '#bytes' 30 || lab_fail "$workload traffic did not start"
      CUT_JOBS=(A:cli B:srv)
      CUT_PROTECTED=(A:cli B:srv)
      ;;
    *) lab_fail "unknown cut workload '$workload'" ;;
  esac
}

# cut_workload_ok WORKLOAD: every process exited 0 with its full count. Notes what is missing.
cut_workload_ok() {
  local workload=$1 j st rc=0
  for j in "${CUT_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    [[ $st == 0 ]] || { note "$j: ${st:+exit status }${st:-hung (killed)}"; rc=1; }
  done
  case $workload in
    nccl_pattern) nccl_check_pass || rc=1 ;;
    rping)
      # rping -v prints one "ping data" line per verified ping on the client.
      local pings
      pings=$(grep -c 'ping data' "$SCEN_DIR/A/cli.log")
      figure pings "$pings"
      [[ $pings == "$CUT_RPING_COUNT" ]] || { note "rping: $pings of $CUT_RPING_COUNT pings verified"; rc=1; }
      # The server ended on a DISCONNECTED the shim gave (the CM's own went over the cut rail):
      # the client's disconnect, carried to it, or its own, once the client's shim confirmed it
      # (rping's server also disconnects after its count: either may go first). rping printed it.
      grep -q 'DISCONNECT EVENT' "$SCEN_DIR/B/srv.log" ||
        { note "B:srv: rping saw no RDMA_CM_EVENT_DISCONNECTED"; rc=1; }
      if [[ $SCEN_VARIANT == shim ]] && (($(shim_log_count B srv \
        'disconnected its rdma_cm connection|confirmed the rdma_cm disconnect') == 0)); then
        note "B:srv: its shim gave no rdma_cm DISCONNECTED (neither the peer's nor its own)"
        rc=1
      fi
      ;;
    rstream)
      # Each side prints its result line ("custom 4k 1k ITERS ...") only after every transfer.
      for j in A:cli B:srv; do
        grep -qE "^custom +4k +1k +$CUT_RSTREAM_ITERS " "$SCEN_DIR/${j%%:*}/${j#*:}.log" ||
          { note "$j: no result line for $CUT_RSTREAM_ITERS iterations"; rc=1; }
      done
      ;;
    rc_pingpong | rc_pingpong_events | srq_pingpong)
      # "1000 iters in 9.87 seconds = 9870.00 usec/iter", printed by both sides.
      local want=$CUT_PINGPONG_ITERS
      [[ $workload == srq_pingpong ]] && want=$CUT_SRQ_ITERS
      for j in A:cli B:srv; do
        grep -q "^$want iters in " "$SCEN_DIR/${j%%:*}/${j#*:}.log" ||
          { note "$j: no '$want iters' line"; rc=1; }
      done
      # -c (srq_pingpong): a wrong buffer is only printed, the exit status stays 0.
      if grep -q 'invalid data in page' "$SCEN_DIR/A/cli.log"; then
        note "A:cli: $(grep -c 'invalid data in page' "$SCEN_DIR/A/cli.log") 'invalid data in page' lines"
        rc=1
      fi
      local usec
      usec=$(awk '/iters in .* usec\/iter/ {print $(NF-1)}' "$SCEN_DIR/A/cli.log")
      [[ -n $usec ]] && figure usec_per_iter "$usec"
      ;;
    *)
      local it bw
      it=$(perftest_figure A cli 2)
      bw=$(perftest_figure A cli 4)
      [[ -n $bw ]] && figure MBps "$bw"
      [[ $it == "$CUT_PERFTEST_ITERS" ]] ||
        { note "$workload: the client's result table says ${it:-nothing}, not $CUT_PERFTEST_ITERS iterations"; rc=1; }
      ;;
  esac
  return "$rc"
}

# cut_scenario WORKLOAD FAULT [HOST]: the whole scenario (FAULT: port_down, cable_cut or blackhole
# of HOST's rail 0; HOST A unless given: B is the "remote cut", seen only by the server's host, which
# must move both ends through the control channel). Sets CUT_RC_WORKLOAD (0: the workload came
# through) for scenarios that check more.
cut_scenario() {
  local workload=$1 kind=$2 host=${3:-A} j st
  cut_start "$workload"
  after_seconds "$CUT_AFTER"
  for j in "${CUT_JOBS[@]}"; do
    [[ -z $(job_rc "${j%%:*}" "${j#*:}") ]] ||
      lab_fail "$j ended before the fault (status $(job_rc "${j%%:*}" "${j#*:}")): make the run longer (VF_CUT_*)"
  done
  fault "$kind" "$host" rail0
  wait_jobs_or_failure "$CUT_BOUND" 10 "${CUT_JOBS[@]}"
  local states=() describe=()
  for j in "${CUT_JOBS[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    states+=("$j=${st:-hung}")
    # Under the shim a hung process is a defect to explain; without it, the expected outcome.
    describe=()
    [[ -z $st && $SCEN_VARIANT == shim ]] && describe=(--stacks)
    kill_job "${j%%:*}" "${j#*:}" "${describe[@]}"
  done
  for j in "${CUT_ALSO_STOP[@]}"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    [[ -n $st ]] || note "$j: still waiting for rdma_cm's disconnect (sent over the cut rail); stopped"
    kill_job "${j%%:*}" "${j#*:}"
  done
  figure exit "$(IFS=,; printf '%s' "${states[*]}")"
  CUT_RC_WORKLOAD=0
  cut_workload_ok "$workload" || CUT_RC_WORKLOAD=1
  if [[ $SCEN_VARIANT != shim ]]; then
    # The control: a workload that came through an unprotected cut means the fault was not real.
    ((CUT_RC_WORKLOAD)) || note "no shim, yet the workload came through the $kind: the fault did not bite"
    ((CUT_RC_WORKLOAD)) && note "no shim: the workload did not survive the $kind (as the control expects)"
    return "$CUT_RC_WORKLOAD"
  fi
  local rc=$CUT_RC_WORKLOAD
  for j in "${CUT_PROTECTED[@]}"; do
    assert_failover "${j%%:*}" "${j#*:}" || rc=1
  done
  failover_figures "$host"
  return "$rc"
}

# remote_cut_scenario WORKLOAD JOB: the cut on B (B's rail 0 port down) while A drives WORKLOAD;
# with the shim, A's JOB must also show a failover asked for by B (peer_request): A saw no fault
# of its own, so it moved because B's shim asked, not only on its own errors.
remote_cut_scenario() {
  local rc=0
  cut_scenario "$1" port_down B || rc=1
  [[ $SCEN_VARIANT == shim ]] || return "$rc"
  assert_stats A "$2" 'any(e["reason"] == "peer_request" for q in qps(s) for e in q["events"])' || rc=1
  return "$rc"
}
