#!/usr/bin/env bash
# One preload check per invocation: runs a test program in a subprocess with the shim loaded the
# way the case says, and asserts on its exit status, its output and the shim's trace log.
# Environment (set by ctest): VF_SHIM (the .so), VF_BIN (test programs), VF_WORK (scratch).
set -euo pipefail
case_name=$1
: "${VF_SHIM:?}" "${VF_BIN:?}" "${VF_WORK:?}"
work="$VF_WORK/$case_name"
rm -rf "$work"
mkdir -p "$work"
log="$work/trace.log"
out="$work/out.txt"
shim_name=libverbs_failover.so

fail() { echo "FAIL [$case_name]: $*"; echo "--- output"; cat "$out" 2>/dev/null || true;
         echo "--- trace log"; head -c 20000 "$log" 2>/dev/null || true; exit 1; }
# Runs a command with a hard bound: a hang is a failure, never a stuck CI.
run() { timeout --kill-after=5 30 "$@"; }
expect_in() { grep -qE -- "$2" "$1" || fail "expected /$2/ in $(basename "$1")"; }
expect_not_in() { ! grep -qE -- "$2" "$1" || fail "did not expect /$2/ in $(basename "$1")"; }
trace_env=(VERBS_FAILOVER_LOG=trace "VERBS_FAILOVER_LOG_FILE=$log")

case "$case_name" in
  linked_symbols)
    # Path a: a program linked against libibverbs, shim in LD_PRELOAD.
    run env LD_PRELOAD="$VF_SHIM" "${trace_env[@]}" "$VF_BIN/vf_linked_program" --expect "$shim_name" >"$out" 2>&1 ||
      fail "linked program did not see the shim for every verb"
    expect_in "$out" "^PASS: 0 mismatches"
    expect_in "$log" "trace: ibv_get_device_list\(num_devices=0x[0-9a-f]+\) = "
    # Exact pass-through of the result: same list/errno line as without the shim.
    env "$VF_BIN/vf_linked_program" --expect libibverbs >"$work/direct.txt" 2>&1 || true
    [ "$(grep GET_DEVICE_LIST "$out")" = "$(grep GET_DEVICE_LIST "$work/direct.txt")" ] ||
      fail "ibv_get_device_list result differs with the shim: $(grep GET_DEVICE_LIST "$out") vs $(grep GET_DEVICE_LIST "$work/direct.txt")"
    ;;
  linked_symbols_control)
    # Without the shim the same check must fail: it can tell the two apart.
    if run "$VF_BIN/vf_linked_program" --expect "$shim_name" >"$out" 2>&1; then
      fail "the check passed without the shim loaded"
    fi
    expect_in "$out" "MISMATCH"
    ;;
  nccl_libibverbs_so | nccl_libibverbs_so1)
    # Path b: NCCL's dlopen + dlvsym(IBVERBS_1.x), shim only in LD_PRELOAD.
    name=libibverbs.so; [ "$case_name" = nccl_libibverbs_so1 ] && name=libibverbs.so.1
    run env -u NCCL_IBVERBS_LIB LD_PRELOAD="$VF_SHIM" "${trace_env[@]}" "$VF_BIN/vf_nccl_loader" --expect "$shim_name" --name "$name" >"$out" 2>&1 ||
      fail "dlvsym on dlopen(\"$name\") did not give the shim's functions"
    expect_in "$out" "^PASS: 0 mismatches"
    expect_in "$log" "trace: ibv_get_device_list\("
    ;;
  nccl_ibverbs_lib)
    # Path c: NCCL >= 2.30.3, NCCL_IBVERBS_LIB names the shim, no LD_PRELOAD at all.
    run env -u LD_PRELOAD NCCL_IBVERBS_LIB="$VF_SHIM" "${trace_env[@]}" "$VF_BIN/vf_nccl_loader" --expect "$shim_name" >"$out" 2>&1 ||
      fail "NCCL_IBVERBS_LIB did not give the shim's functions"
    expect_in "$out" "^PASS: 0 mismatches"
    expect_in "$log" "trace: ibv_get_device_list\("
    ;;
  nccl_control)
    if run env -u LD_PRELOAD -u NCCL_IBVERBS_LIB "$VF_BIN/vf_nccl_loader" --expect "$shim_name" >"$out" 2>&1; then
      fail "the dlvsym check passed without the shim"
    fi
    expect_in "$out" "RESOLVED ibv_get_device_list@IBVERBS_1.1 .*/libibverbs\.so(\.1)? MISMATCH"
    ;;
  nccl_disabled)
    # VERBS_FAILOVER=0: the dlopen hook stands aside, NCCL gets libibverbs itself.
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER=0 "$VF_BIN/vf_nccl_loader" --expect libibverbs.so.1 --name libibverbs.so.1 >"$out" 2>&1 ||
      fail "with VERBS_FAILOVER=0 dlvsym should give libibverbs' own functions"
    expect_in "$out" "^PASS: 0 mismatches"
    ;;
  disabled_no_trace)
    # VERBS_FAILOVER=0 with trace requested: linked hooks call straight through, log nothing.
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER=0 "${trace_env[@]}" "$VF_BIN/vf_linked_program" --expect "$shim_name" >"$out" 2>&1 ||
      fail "linked program failed with VERBS_FAILOVER=0"
    [ ! -s "$log" ] || expect_not_in "$log" "trace:"
    ;;
  rdmacm)
    # Path d: librdmacm calls libibverbs itself; those calls must reach the shim.
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_BACKTRACE=1 "${trace_env[@]}" "$VF_BIN/vf_rdmacm_program" >"$out" 2>&1 ||
      fail "rdmacm program failed under the shim"
    run env -u LD_PRELOAD "$VF_BIN/vf_rdmacm_program" >"$work/direct.txt" 2>&1 || fail "rdmacm program failed without the shim"
    diff -u "$work/direct.txt" "$out" >"$work/diff.txt" || fail "librdmacm saw different results with the shim: $(cat "$work/diff.txt")"
    expect_in "$log" "trace: ibv_get_device_list\(.*caller:.*librdmacm\.so"
    ;;
  dlopen_runpath)
    # The dlopen hook must not change how other libraries are found (caller's RUNPATH).
    run env LD_PRELOAD="$VF_SHIM" "$VF_BIN/vf_runpath_program" >"$out" 2>&1 ||
      fail "a library found through the caller's RUNPATH was not found under the shim"
    expect_in "$out" "^PASS: answer=42"
    ;;
  bad_config)
    # Bad settings: one clear line each, naming the variable and the accepted values; the program
    # still runs and behaves exactly as without the shim.
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=loud VERBS_FAILOVER_LOG_FILE=/nonexistent-dir/x.log VERBS_FAILOVER=maybe \
      "$VF_BIN/vf_linked_program" --expect "$shim_name" >"$out" 2>&1 || fail "program did not run with bad settings"
    expect_in "$out" "^verbs-failover: VERBS_FAILOVER_LOG='loud' is not a log level; accepted values: error\|warn\|info\|debug\|trace; using warn$"
    expect_in "$out" "^verbs-failover: VERBS_FAILOVER_LOG_FILE='/nonexistent-dir/x.log' cannot be opened \(No such file or directory\); accepted values: a writable file path"
    expect_in "$out" "^verbs-failover: VERBS_FAILOVER='maybe' is not understood; accepted values: 1\|0\|on\|off"
    expect_in "$out" "^PASS: 0 mismatches"
    [ "$(grep -c '^verbs-failover:' "$out")" -eq 3 ] || fail "expected exactly 3 configuration lines"
    ;;
  log_file_pid)
    env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=trace "VERBS_FAILOVER_LOG_FILE=$work/vf-%p.log" \
      bash -c 'echo "PID $$"; exec "$0" --expect libverbs_failover.so' "$VF_BIN/vf_linked_program" >"$out" 2>&1 ||
      fail "program failed"
    pid=$(awk '/^PID/{print $2}' "$out")
    log="$work/vf-$pid.log"
    [ -s "$log" ] || fail "no log file vf-$pid.log (found: $(ls "$work"))"
    expect_in "$log" "^verbs-failover\[$pid:$pid\] trace: ibv_get_device_list\(.*\) = .* errno=[0-9]+.* \([0-9]+ ns\)$"
    ;;
  log_file_lazy)
    # A process that loads the shim and never touches verbs (a job-wide preload reaches every
    # shell, python and data-loader worker) leaves no log file behind: files appear only when
    # there is something to write. The same setting, with something to write, still makes one.
    run env LD_PRELOAD="$VF_SHIM" "VERBS_FAILOVER_LOG_FILE=$work/quiet-%p.log" \
      bash -c 'echo "PID $$"; /bin/true; exec /bin/true' >"$out" 2>&1 || fail "shell failed under the shim"
    found=$(find "$work" -name 'quiet-*.log' | wc -l)
    [ "$found" -eq 0 ] || fail "$found log file(s) created by processes with nothing to log: $(ls "$work")"
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=debug "VERBS_FAILOVER_LOG_FILE=$work/debug-%p.log" \
      bash -c 'echo "PID $$"; exec /bin/true' >"$out" 2>&1 || fail "shell failed under the shim"
    pid=$(awk '/^PID/{print $2}' "$out")
    [ -s "$work/debug-$pid.log" ] || fail "no log file debug-$pid.log with something to write (found: $(ls "$work"))"
    expect_in "$work/debug-$pid.log" "debug: initialised: hooks active"
    ;;
  fork)
    # fork() after initialisation: children use verbs and log as themselves.
    run env LD_PRELOAD="$VF_SHIM" "${trace_env[@]}" "$VF_BIN/vf_fork_program" >"$out" 2>&1 ||
      fail "fork program failed (a child hung or failed)"
    expect_in "$out" "^PASS: 0 failed children"
    [ "$(grep -c "^CHILD " "$out")" -eq 5 ] || fail "expected 5 children"
    while read -r _ pid; do
      expect_in "$log" "^verbs-failover\[$pid:$pid\] trace: ibv_get_device_list\("
    done < <(grep '^CHILD ' "$out")
    ;;
  backtrace_crash)
    # A crash inside the shim prints a symbolised stack before the process dies by its signal.
    set +e
    run env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_BACKTRACE=1 "VERBS_FAILOVER_LOG_FILE=$log" "$VF_BIN/vf_crash_program" >"$out" 2>&1
    status=$?
    set -e
    [ "$status" -eq 139 ] || fail "expected death by SIGSEGV (status 139), got $status"
    expect_in "$log" "fatal signal 11 \(SIGSEGV\)"
    expect_in "$log" "#[0-9]+ 0x[0-9a-f]+ verbs_failover_debug_crash\+0x[0-9a-f]+ \(libverbs_failover.so\)"
    expect_in "$log" "#[0-9]+ 0x[0-9a-f]+ main\+0x[0-9a-f]+ \(vf_crash_program\)"
    ;;
  no_libibverbs)
    # A machine without rdma-core (issue 19 item 13): a job-wide LD_PRELOAD reaches every process,
    # so a program that never uses verbs must run as without the shim, with one info line. The
    # shim must not depend on libibverbs (DT_NEEDED: the loader stops the program, rc 127).
    # libibverbs is hidden in a private mount namespace (root only: CI runs as root).
    [ "$(id -u)" = 0 ] || { echo "SKIP [$case_name]: needs root for a private mount namespace"; exit 77; }
    real=$(readlink -f "${VF_REAL_IBVERBS:?}")
    [ -f "$real" ] || fail "libibverbs not found at $VF_REAL_IBVERBS"
    ! readelf -d "$VF_SHIM" | grep -q 'NEEDED.*libibverbs' ||
      fail "the shim has a DT_NEEDED dependency on libibverbs: $(readelf -d "$VF_SHIM" | grep NEEDED)"
    hidden() {  # runs "$@" with libibverbs hidden (its file replaced by an empty one)
      run unshare -m --propagation private bash -c 'mount --bind /dev/null "$0" || exit 90; exec "$@"' \
        "$real" "$@"
    }
    # The check can fail: with libibverbs hidden, a program linked to it does not start.
    if hidden "$VF_BIN/vf_linked_program" --expect libibverbs >"$work/control.txt" 2>&1; then
      fail "libibverbs was not hidden: a program linked to it ran"
    fi
    hidden env LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=info "VERBS_FAILOVER_LOG_FILE=$log" \
      /bin/sh -c 'echo program ran' >"$out" 2>&1 || fail "a program without verbs failed under the shim"
    expect_in "$out" "^program ran$"
    expect_not_in "$out" "error while loading"
    expect_in "$log" "info: libibverbs.so.1 cannot be loaded .*verbs-failover stays idle"
    [ "$(grep -c . "$log")" = 1 ] || fail "expected one log line, got $(grep -c . "$log")"
    # NCCL told to load the shim itself (NCCL_IBVERBS_LIB) on such a machine: every verb it looks
    # up is found, and the first call says "no devices" (NCCL then uses sockets), never a crash.
    hidden env NCCL_IBVERBS_LIB="$VF_SHIM" "$VF_BIN/vf_nccl_loader" --expect "$shim_name" \
      >"$work/nccl.txt" 2>&1 || fail "NCCL's loader with the shim as its libibverbs failed: $(cat "$work/nccl.txt")"
    expect_in "$work/nccl.txt" "^DEVICES 0$"
    expect_in "$work/nccl.txt" "^PASS: 0 mismatches"
    ;;
  exports_match_libibverbs)
    # Every hook is exported under the version node libibverbs gives the same verb (else
    # dlvsym/PLT references miss it); a verb libibverbs lacks must be the optional 1.16 one.
    # The library the build linked against (no `ldconfig -p | awk '...exit'`: under pipefail the
    # early exit's SIGPIPE made this check fail at random).
    real=$(readlink -f "${VF_REAL_IBVERBS:?}")
    [ -f "$real" ] || fail "libibverbs not found at $VF_REAL_IBVERBS"
    # Default versions only: "(IBVERBS_1.0)" (hidden compatibility aliases) must not be matched.
    objdump -T "$real" | awk 'NF >= 3 && $4 != "*UND*" && $NF ~ /ibv_/ && $(NF-1) !~ /^\(/ {print $(NF-1)" "$NF}' | sort -u >"$work/real.txt"
    objdump -T "$VF_SHIM" | awk 'NF >= 3 && $4 != "*UND*" && $NF ~ /ibv_/ {print $(NF-1)" "$NF}' | sort -u >"$out"
    # Exactly the verbs of shim/real_verbs.h's list, each once, none hidden.
    src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shim/real_verbs.h
    grep -oE '^  X\(([a-z_]*ibv_[a-z0-9_]+), "(IBVERBS_[0-9.]+)"\)' "$src" | sed -E 's/^  X\((.*), "(.*)"\)/\2 \1/' | sort -u >"$work/listed.txt"
    [ "$(wc -l <"$work/listed.txt")" -ge 58 ] || fail "could not read the verb list from $src"
    diff -u "$work/listed.txt" "$out" >"$work/diff.txt" || fail "exports differ from the hooked-verb list: $(cat "$work/diff.txt")"
    ! grep -q '(' "$out" || fail "a hook is exported as a hidden version"
    while read -r version name; do
      if ! grep -qx "$version $name" "$work/real.txt"; then
        [ "$name" = ibv_query_port_speed ] && continue
        fail "$name@$version is exported by the shim but libibverbs has no such versioned symbol"
      fi
    done <"$out"
    # And the other way: every public symbol of libibverbs (not its providers' IBVERBS_PRIVATE_*)
    # is the shim's too, or a lookup through the handle the shim gives for libibverbs (NCCL's
    # path: the shim has no DT_NEEDED to fall through to) would miss it.
    while read -r version name; do
      case "$version" in IBVERBS_1.*) ;; *) continue ;; esac
      grep -qx "$version $name" "$out" ||
        fail "libibverbs exports $name@$version, the shim does not (add it to shim/real_verbs.h)"
    done <"$work/real.txt"
    ;;
  datapath_fake_passthrough | datapath_fake_disabled)
    # Path e on the fake fabric (two fake NICs of two "hosts" in one process): every published
    # function reaches the shim, and the transcript is identical to the run without the shim.
    : "${VF_FAKE_LIB_DIR:?}"
    args=(--dev-a fake0 --dev-b fake2 --gid-index 1 --raw)
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" "$VF_BIN/vf_datapath_program" "${args[@]}" >"$work/direct.txt" 2>&1 ||
      { cp "$work/direct.txt" "$out"; fail "datapath program failed on the fake without the shim"; }
    extra=(); [ "$case_name" = datapath_fake_disabled ] && extra=(VERBS_FAILOVER=0)
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" LD_PRELOAD="$VF_SHIM" "${trace_env[@]}" "${extra[@]}" \
      "$VF_BIN/vf_datapath_program" "${args[@]}" >"$out" 2>&1 || fail "datapath program failed under the shim"
    expect_in "$out" "^PASS$"
    diff -u <(grep -v '^OPS ' "$work/direct.txt") <(grep -v '^OPS ' "$out") >"$work/diff.txt" ||
      fail "transcript differs with the shim: $(cat "$work/diff.txt")"
    if [ "$case_name" = datapath_fake_passthrough ]; then
      want=$shim_name
      for verb in ibv_post_send ibv_post_recv ibv_poll_cq ibv_req_notify_cq ibv_create_qp_ex \
                  "ibv_query_port\(ex\)" ibv_query_device_ex ibv_wr_start ibv_wr_rdma_write_imm \
                  ibv_wr_set_sge ibv_wr_complete ibv_create_cq_ex ibv_post_srq_recv ibv_start_poll; do
        expect_in "$log" "trace: $verb\("
      done
    else
      want=libibverbs.so.1   # the fake's ops: the shim patched nothing
      expect_not_in "$log" "trace:"
    fi
    for op in post_send post_recv poll_cq req_notify_cq query_port create_qp_ex query_device_ex \
              wr_start wr_complete post_srq_recv create_cq_ex start_poll next_poll; do
      expect_in "$out" "^OPS $op $want$"
    done
    ;;
  port_monitor_fake)
    # The shim's own port watch: a fake port down/up is seen by its monitor thread. fake0 has
    # no backup here (the pairs leave it out), so it is unprotected and the application still
    # receives its own PORT_ERR/PORT_ACTIVE events.
    : "${VF_FAKE_LIB_DIR:?}"
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=info \
      VERBS_FAILOVER_PAIRS=fake2:fake3,fake3:fake2 \
      "VERBS_FAILOVER_LOG_FILE=$log" "$VF_BIN/vf_port_monitor_program" >"$out" 2>&1 ||
      fail "port monitor program failed"
    expect_in "$out" "^WATCHED changes=0$"
    expect_in "$out" "^MONITOR down_seen=1 up_seen=1 app_down=1 app_up=1$"
    expect_in "$log" "info: port fake0/1 is DOWN \(was ACTIVE; "
    expect_in "$log" "info: port fake0/1 is ACTIVE \(was DOWN; "
    expect_in "$log" "warn: failover: fake0/1 has no usable backup port"
    ;;
  port_events_hidden_fake)
    # A protected port (fake0 backed up by fake1): its PORT_ERR/PORT_ACTIVE never reach the
    # application; the shim says so in its log.
    : "${VF_FAKE_LIB_DIR:?}"
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" LD_PRELOAD="$VF_SHIM" VERBS_FAILOVER_LOG=info \
      EXPECT_APP_EVENTS=0 "VERBS_FAILOVER_LOG_FILE=$log" "$VF_BIN/vf_port_monitor_program" \
      >"$out" 2>&1 || fail "port monitor program failed"
    expect_in "$out" "^MONITOR down_seen=1 up_seen=1 app_down=0 app_up=0$"
    expect_in "$log" "info: failover: fake0/1 is backed up by fake1/1"
    expect_in "$log" "info: failover: hid port error of fake0/1 from the application"
    expect_in "$log" "info: failover: hid port active of fake0/1 from the application"
    ;;
  dv_create_cq_fake)
    # A provider's direct-verbs CQ creation with a completion channel whose fd the shim replaced
    # (an epoll set): the provider must get the real event file (core/failover/channel_wakeup.h).
    : "${VF_FAKE_LIB_DIR:?}"
    run env LD_LIBRARY_PATH="$VF_FAKE_LIB_DIR" LD_PRELOAD="$VF_SHIM" \
      "VERBS_FAILOVER_LOG_FILE=$log" "$VF_BIN/vf_dv_cq_program" >"$out" 2>&1 ||
      fail "dv CQ program failed"
    expect_in "$out" "^CHANNEL_FD_REPLACED=1$"
    expect_in "$out" "^DV_CQ PASS$"
    ;;
  *)
    echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
