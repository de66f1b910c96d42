# shellcheck shell=bash
# The functions a scenario (scripts/lab/scenarios/<name>.sh) calls; docs/lab.md is the contract.
# A scenario runs in a subshell of the runner with these variables set:
#   SCEN_NAME     the scenario as run (e.g. ib_write_bw@shim)   SCEN_VARIANT  plain | shim
#   SCEN_DIR      its results folder (A/ and B/ hold each host's job logs)
#   LAB_PORT      a TCP port for the scenario's own bootstrap, distinct per scenario of a run
#   REPO_DIR, VF_SHIM, LAB_DIR

declare -A SCEN_JOB=() # "HOST:NAME" -> agent job id

_check_host() {
  [[ $1 == A || $1 == B ]] || lab_fail "unknown host '$1' (A or B)"
}

# ip_of HOST NET -> the address of HOST (A|B) on NET (mgmt|rail0|rail1)
ip_of() {
  local p=${LAB_NET_PREFIX[$2]:-}
  [[ -n $p ]] || lab_fail "unknown network '$2' (mgmt, rail0, rail1)"
  printf '%s.%s' "$p" "${LAB_HOST_OCTET[$1]}"
}

# _start KIND HOST NAME [VAR=VALUE...] [--] COMMAND [ARG...]
_start() {
  local kind=$1 h=$2 name=$3
  shift 3
  _check_host "$h"
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || lab_fail "job name '$name' must be [A-Za-z0-9_.-]+"
  [[ -z ${SCEN_JOB[$h:$name]:-} ]] || lab_fail "job $h:$name started twice"
  local envs=()
  if [[ $kind == app && $SCEN_VARIANT == shim ]]; then
    # The shim's statistics are written at exit where the host reads them (failover_stats.py).
    envs+=("LD_PRELOAD=$VF_SHIM" "VERBS_FAILOVER_LOG_FILE=$SCEN_DIR/$h/$name.vf.%p.log"
      "VERBS_FAILOVER_STATS=$SCEN_DIR/$h/stats.$h.$name.%p.json")
    # The caller's VERBS_FAILOVER_* settings (log level, backtraces...) reach the application.
    local v
    while read -r v; do
      [[ $v == VERBS_FAILOVER_LOG_FILE || $v == VERBS_FAILOVER_STATS ]] || envs+=("$v=${!v}")
    done < <(compgen -e | grep '^VERBS_FAILOVER_' || true)
  fi
  while (($#)) && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    envs+=("$1")
    shift
  done
  [[ ${1:-} == -- ]] && shift
  (($#)) || lab_fail "job $h:$name has no command"
  # The header comes first so that only the command itself sees the job's environment.
  local script e
  script="echo \"# \$(date -u +%FT%T.%3NZ) host $h job $name pid \$\$: \"$(printf '%q' "$(printf '%q ' "$@")")"$'\n'
  for e in "${envs[@]}"; do
    script+="export ${e%%=*}=$(printf '%q' "${e#*=}")"$'\n'
  done
  script+="exec $(printf '%q ' "$@")"
  job_submit "$h" "$name" "$SCEN_DIR/$h/$name.log" "$script"
  SCEN_JOB[$h:$name]=$JOB_ID
  local shown="$*"
  log "start $h:$name: ${shown//$'\n'/ }"
}

# on HOST NAME [VAR=VALUE...] [--] COMMAND [ARG...]: start COMMAND in HOST, in the background.
# Output goes to $SCEN_DIR/HOST/NAME.log. NAME identifies the job for the wait/kill functions.
on() { _start on "$@"; }

# app HOST NAME ...: like `on`, for the program under test. In the @shim variant it runs with
# LD_PRELOAD=$VF_SHIM, VERBS_FAILOVER_LOG_FILE=$SCEN_DIR/HOST/NAME.vf.%p.log and
# VERBS_FAILOVER_STATS=$SCEN_DIR/HOST/stats.HOST.NAME.%p.json.
app() { _start app "$@"; }

# shim_log_count HOST NAME REGEX: lines (extended regex) matching in the shim logs of the job app()
# started as NAME (one per process it ran), 0 when there are none.
shim_log_count() {
  cat "$SCEN_DIR/$1/$2".vf.*.log 2>/dev/null | grep -Ec -- "$3" || true
}

# shim_says HOST JOB REGEX: the job's shim log has a line matching REGEX.
shim_says() {
  (($(shim_log_count "$1" "$2" "$3") > 0))
}

# Sets _ID (a command substitution could not stop the scenario on an unknown job).
_job_id() {
  _ID=${SCEN_JOB[$1:$2]:-}
  [[ -n $_ID ]] || lab_fail "no job $1:$2 was started"
}

# job_rc HOST NAME -> prints the exit status, or nothing while the job runs.
job_rc() {
  _job_id "$1" "$2"
  job_rc_id "$1" "$_ID"
}

# wait_job HOST NAME TIMEOUT: returns the job's exit status; 124 (and a log line) if it still runs
# after TIMEOUT seconds; it is then left running (kill_job it, or the runner ends it).
wait_job() {
  local rc=0
  _job_id "$1" "$2"
  job_wait_id "$1" "$_ID" "$3" || rc=$?
  if ((WAIT_TIMED_OUT)); then
    log "$1:$2 still running after $3 s"
  else
    log "$1:$2 exited with status $rc"
  fi
  return "$rc"
}

# wait_jobs TIMEOUT HOST:NAME...: wait for all of them under one deadline. Returns 0 only if every
# one exited with status 0; each outcome is logged.
wait_jobs() {
  local timeout=$1
  shift
  local end=$(($(now_ms) + timeout * 1000)) j rc all=0 left
  for j in "$@"; do
    left=$(((end - $(now_ms) + 999) / 1000))
    ((left > 0)) || left=0
    rc=0
    wait_job "${j%%:*}" "${j#*:}" "$left" || rc=$?
    ((rc == 0)) || all=1
  done
  return "$all"
}

# wait_jobs_or_failure TIMEOUT GRACE HOST:NAME...: like wait_jobs, but stops early once a job has
# exited with a non-zero status: the others get GRACE more seconds (so that their logs show how
# they saw the failure), then it returns 1. Jobs still running are left running (the caller kills
# them, or the runner does). Returns 0 only if every job exited with status 0.
wait_jobs_or_failure() {
  local timeout=$1 grace=$2
  shift 2
  local end=$(($(now_ms) + timeout * 1000)) j rc pending failed=0
  while :; do
    pending=0
    for j in "$@"; do
      _job_id "${j%%:*}" "${j#*:}"
      rc=$(job_rc_id "${j%%:*}" "$_ID")
      if [[ -z $rc ]]; then
        pending=1
      elif [[ $rc != 0 ]] && ((!failed)); then
        failed=1
        log "$j exited with status $rc; the others get ${grace} s"
        local grace_end=$(($(now_ms) + grace * 1000))
        ((grace_end < end)) && end=$grace_end
      fi
    done
    ((pending)) || break
    (($(now_ms) < end)) || break
    sleep 0.2
  done
  local all=0
  for j in "$@"; do
    _job_id "${j%%:*}" "${j#*:}"
    rc=$(job_rc_id "${j%%:*}" "$_ID")
    log "$j: ${rc:+exited with status }${rc:-still running}"
    [[ $rc == 0 ]] || all=1
  done
  return "$all"
}

# expect_exit_zero TIMEOUT HOST:NAME...: waits for the jobs (wait_jobs_or_failure, 10 s of grace
# after the first failure); notes each that did not exit 0 (its status, or hung) and ends those
# still running. False unless every one exited 0.
expect_exit_zero() {
  local timeout=$1 j st rc=0
  shift
  wait_jobs_or_failure "$timeout" 10 "$@" || rc=1
  for j in "$@"; do
    st=$(job_rc "${j%%:*}" "${j#*:}")
    [[ $st == 0 ]] || { note "$j: ${st:+exit status }${st:-hung (killed)}"; rc=1; kill_job "${j%%:*}" "${j#*:}"; }
  done
  return "$rc"
}

# kill_job HOST NAME [--stacks]: end the job's process group by PID (TERM, then KILL); bounded.
# With --stacks (a job that should have ended: it hangs) every thread of it is described first,
# in HOST/NAME.stacks.txt; the log gets one line per thread (state, CPU use, system call).
kill_job() {
  _job_id "$1" "$2"
  local id=$_ID request=""
  [[ ${3:-} == --stacks ]] && request=stacks
  [[ -n $(job_rc_id "$1" "$id") ]] && return 0
  log "kill $1:$2${request:+ (threads described first)}"
  if ! job_kill_id "$1" "$id" "$request"; then
    touch "$SCEN_DIR/.vm-killed"
    note "host $1 could not end job $2: VM hung, killed"
  fi
  local stacks=$CTL_ROOT/$1/run/$id.stacks
  if [[ -n $request && -s $stacks ]]; then
    mkdir -p "$SCEN_DIR/$1"
    cp "$stacks" "$SCEN_DIR/$1/$2.stacks.txt"
    log "threads of the hung job $1:$2 (all in $1/$2.stacks.txt):"
    grep -E '^(== process|-- thread)' "$stacks" | while IFS= read -r line; do log "  $line"; done
  fi
}

# run_on HOST NAME TIMEOUT [VAR=VALUE...] [--] COMMAND...: start and wait; returns its status.
run_on() {
  local h=$1 name=$2 timeout=$3
  shift 3
  on "$h" "$name" "$@"
  local rc=0
  wait_job "$h" "$name" "$timeout" || rc=$?
  if ((WAIT_TIMED_OUT)); then
    kill_job "$h" "$name" --stacks
  fi
  return "$rc"
}

WAIT_SEQ=0
# wait_guest HOST TIMEOUT CONDITION: evaluate a shell condition inside HOST until it holds.
# Predicates available there: tcp_listening PORT, cm_listening ADDR, port_state rxeN STATE.
wait_guest() {
  local h=$1 timeout=$2
  shift 2
  WAIT_SEQ=$((WAIT_SEQ + 1))
  run_on "$h" "wait$WAIT_SEQ" $((timeout + 20)) "$LAB_DIR/guest/wait-until" "$timeout" "$*"
}

# wait_listen HOST PORT TIMEOUT: a TCP server in HOST listens on PORT.
wait_listen() { wait_guest "$1" "$3" "tcp_listening $2"; }

# wait_cm_listen HOST ADDR TIMEOUT: an RDMA-CM server in HOST listens on ADDR.
wait_cm_listen() { wait_guest "$1" "$3" "cm_listening $2"; }

# wait_log HOST NAME REGEX TIMEOUT: the job's log has a line matching REGEX (grep -E). Fails at
# once if the job ends without printing it. Programs writing to a file buffer their stdout: run
# them under `stdbuf -oL` when a scenario waits for their output.
wait_log() {
  local h=$1 name=$2 re=$3 timeout=$4
  _job_id "$h" "$name"
  local id=$_ID
  local f=$SCEN_DIR/$h/$name.log
  local end=$(($(now_ms) + timeout * 1000))
  while :; do
    grep -Eq -- "$re" "$f" 2>/dev/null && return 0
    if [[ -n $(job_rc_id "$h" "$id") ]]; then
      grep -Eq -- "$re" "$f" 2>/dev/null && return 0
      log "$h:$name ended without printing /$re/"
      return 1
    fi
    if (($(now_ms) > end)); then
      log "$h:$name printed no /$re/ within $timeout s"
      return 1
    fi
    sleep 0.1
  done
}

# wait_for TIMEOUT COMMAND...: host-side poll of any command, every 0.1 s, bounded.
wait_for() {
  local timeout=$1
  shift
  poll_until "$timeout" "$@"
}

# after_seconds N: let traffic run for N seconds. This is the *timing* of a fault, never a way to
# synchronise with a program: start conditions use wait_listen / wait_log.
after_seconds() {
  log "letting traffic run for $1 s"
  sleep "$1"
}

# figure KEY VALUE: a key figure for the summary line (and $SCEN_DIR/figures).
figure() {
  printf '%s=%s\n' "$1" "$2" >>"$SCEN_DIR/figures"
  log "figure $1=$2"
}

# note TEXT: a fact worth reading in the summary (reasons of failures, observations).
note() {
  printf '%s\n' "$*" >>"$SCEN_DIR/notes"
  log "note: $*"
}

# lab_fail TEXT: the scenario could not run as designed (not the workload's failure): always FAIL.
lab_fail() {
  note "$*"
  exit 2
}

# ---- fault injection ------------------------------------------------------------------------
# fault port_down   HOST NET     ip link down inside HOST: rxe port DOWN, IBV_EVENT_PORT_ERR there
# fault cable_cut   HOST NET     QEMU set_link off on HOST's NIC: HOST sees carrier loss, peer nothing
# fault blackhole   HOST NET     tc: drop everything HOST sends and receives on NET; no port event
# fault blackhole_udp HOST NET   iptables: drop RoCEv2 (UDP 4791) in and out of NET on HOST
# fault restore     HOST NET     undo every active fault of HOST on NET (latest first)
# fault restore     all          undo every active fault
# fault flap        HOST NET COUNT PERIOD [KIND]   KIND (port_down|cable_cut|blackhole) down for
#                                PERIOD/2 s then up for PERIOD/2 s, COUNT times (blocking)
# Each action is logged with a timestamp in $SCEN_DIR/faults.log. A scenario that injected a fault
# gets fresh VMs before the next scenario runs, restored or not.

# Every fault (not its restore) is also timed on the affected guest's own clock, the clock its
# shim stamps failover events with: a line "KIND HOST NET FAULT_UNIX_NS ERR_NS" in
# $SCEN_DIR/fault_times. The fault happened at most ERR_NS after FAULT_UNIX_NS (docs/lab.md,
# "Failover statistics").
FAULT_SEQ=0
FAULT_NS="" FAULT_ERR_NS=""

# EPOCHREALTIME text (seconds.microseconds) -> nanoseconds
_us_text_to_ns() { printf '%s' "$((${1%.*} * 1000000000 + 10#${1#*.} * 1000))"; }

# _fault_guest HOST WHAT COMMAND: run COMMAND in HOST between two readings of HOST's clock; sets
# FAULT_NS (the reading before) and FAULT_ERR_NS (the command's duration).
_fault_guest() {
  local h=$1 what=$2
  shift 2
  FAULT_SEQ=$((FAULT_SEQ + 1))
  local name=fault$FAULT_SEQ-$what
  # Real-time priority: the fault and its time stamps must not wait behind busy-polling workloads.
  # shellcheck disable=SC2016 # expanded in the guest
  run_on "$h" "$name" 20 chrt -f 20 bash -c 'printf "vf-fault-at %s\n" "$EPOCHREALTIME"; '"$*"'
    rc=$?; printf "vf-fault-done %s\n" "$EPOCHREALTIME"; exit $rc' ||
    lab_fail "fault $what on $h failed (see $SCEN_DIR/$h/$name.log)"
  local at fin
  at=$(awk '$1 == "vf-fault-at" {print $2}' "$SCEN_DIR/$h/$name.log")
  fin=$(awk '$1 == "vf-fault-done" {print $2}' "$SCEN_DIR/$h/$name.log")
  [[ $at == *.* && $fin == *.* ]] || lab_fail "fault $what on $h: no guest time stamps"
  FAULT_NS=$(_us_text_to_ns "$at")
  FAULT_ERR_NS=$(($(_us_text_to_ns "$fin") - FAULT_NS))
}

# _carrier_watch_start HOST DEV: a job in HOST (real-time, polling DEV's carrier every ms through
# sysfs, no fork, no 9p) that prints "vf-carrier-lost PREV NOW" when the carrier drops: the last
# reading that still saw it up and the first that did not, on HOST's clock. Sets CARRIER_JOB.
_carrier_watch_start() {
  local h=$1 dev=$2
  FAULT_SEQ=$((FAULT_SEQ + 1))
  CARRIER_JOB=carrier$FAULT_SEQ
  # shellcheck disable=SC2016 # expanded in the guest
  on "$h" "$CARRIER_JOB" -- chrt -f 20 bash -c 'exec {t}<>/run/vf-lab/tick
    f=/sys/class/net/$1/carrier c=0
    read -r c <"$f" 2>/dev/null
    [[ $c == 1 ]] || { echo "vf-carrier-not-up"; exit 1; }
    echo vf-watching; prev=$EPOCHREALTIME
    while :; do
      c=0; read -r c <"$f" 2>/dev/null; now=$EPOCHREALTIME
      [[ $c == 1 ]] || { echo "vf-carrier-lost $prev $now"; exit 0; }
      prev=$now; read -r -t 0.001 -u "$t" || :
    done' carrier "$dev"
  wait_log "$h" "$CARRIER_JOB" '^vf-watching' 30 || lab_fail "carrier watch on $h $dev did not start"
}

_fault_apply() {
  local kind=$1 h=$2 net=$3 up=$4 dev=${LAB_NET_IFACE[$3]}
  FAULT_NS="" FAULT_ERR_NS=""
  case $kind in
    port_down)
      _fault_guest "$h" "$kind-$up" "ip link set $dev $([[ $up == 1 ]] && echo up || echo down)"
      ;;
    cable_cut)
      local out
      [[ $up == 1 ]] || _carrier_watch_start "$h" "$dev"
      out=$(vm_monitor "$h" "set_link $net $([[ $up == 1 ]] && echo on || echo off)") ||
        lab_fail "QEMU monitor of $h did not answer"
      [[ -z $out ]] || lab_fail "set_link on $h: $out"
      if [[ $up == 0 ]]; then
        wait_log "$h" "$CARRIER_JOB" '^vf-carrier-lost' 20 || lab_fail "$h never lost the carrier of $dev"
        local prev fin
        read -r _ prev fin < <(grep -m1 '^vf-carrier-lost' "$SCEN_DIR/$h/$CARRIER_JOB.log")
        # The guest's kernel dropped the carrier between these two readings of its clock.
        FAULT_NS=$(_us_text_to_ns "$prev")
        FAULT_ERR_NS=$(($(_us_text_to_ns "$fin") - FAULT_NS))
      fi
      ;;
    blackhole)
      if [[ $up == 1 ]]; then
        _fault_guest "$h" "$kind-up" "tc qdisc del dev $dev root; tc qdisc del dev $dev ingress"
      else
        # One tc process for the three changes (three took about 1 s under TCG, the fault's
        # time then uncertain by as much): egress loss first, it is the fault's start.
        _fault_guest "$h" "$kind-down" "printf '%s\\n' 'qdisc add dev $dev root netem loss 100%' \
          'qdisc add dev $dev ingress' 'filter add dev $dev parent ffff: matchall action drop' |
          tc -batch -"
      fi
      ;;
    blackhole_udp)
      local op=-I
      [[ $up == 1 ]] && op=-D
      _fault_guest "$h" "$kind-$up" "iptables $op OUTPUT -o $dev -p udp --dport 4791 -j DROP &&
        iptables $op INPUT -i $dev -p udp --dport 4791 -j DROP"
      ;;
    *) lab_fail "unknown fault kind '$kind'" ;;
  esac
  if [[ $up == 0 && -n $FAULT_NS ]]; then
    printf '%s %s %s %s %s\n' "$kind" "$h" "$net" "$FAULT_NS" "$FAULT_ERR_NS" >>"$SCEN_DIR/fault_times"
    log "fault $kind $h $net at $h's clock $FAULT_NS ns (+0..$((FAULT_ERR_NS / 1000)) us)"
  fi
}

_fault_log() {
  printf '%s %s\n' "$(date -u +%T.%3N)" "$*" >>"$SCEN_DIR/faults.log"
  log "fault: $*"
}

fault() {
  local kind=${1:-}
  shift || true
  : >>"$SCEN_DIR/.faulted"
  local active=$RUN_DIR/faults.active
  touch "$active"
  case $kind in
    port_down | cable_cut | blackhole | blackhole_udp)
      local h=$1 net=$2
      _check_host "$h"
      ip_of "$h" "$net" >/dev/null
      _fault_apply "$kind" "$h" "$net" 0
      printf '%s %s %s\n' "$h" "$net" "$kind" >>"$active"
      _fault_log "$kind $h $net"
      ;;
    restore)
      local sel=$1 net=${2:-}
      local line keep=() undo=()
      while read -r line; do
        [[ -n $line ]] || continue
        if [[ $sel == all || $line == "$sel $net "* ]]; then undo=("$line" "${undo[@]}"); else keep+=("$line"); fi
      done <"$active"
      for line in "${undo[@]}"; do
        # shellcheck disable=SC2086
        set -- $line
        _fault_apply "$3" "$1" "$2" 1
        _fault_log "restore $3 $1 $2"
      done
      printf '%s\n' "${keep[@]}" >"$active"
      ;;
    flap)
      local h=$1 net=$2 count=$3 period=$4 how=${5:-port_down} i half
      half=$(awk -v p="$period" 'BEGIN {printf "%.3f", p / 2}')
      _fault_log "flap $h $net $count x ${period}s ($how)"
      for ((i = 1; i <= count; i++)); do
        _fault_apply "$how" "$h" "$net" 0
        _fault_log "flap $i down"
        sleep "$half"
        _fault_apply "$how" "$h" "$net" 1
        _fault_log "flap $i up"
        sleep "$half"
      done
      ;;
    *) lab_fail "fault: unknown action '$kind'" ;;
  esac
}

# ---- parsing helpers for the stock programs ------------------------------------------------

# PERFTEST_OPTS: options every perftest run of the lab takes. perftest times its transfer in TSC
# cycles and, to print MB/s, estimates the clock by timing gettimeofday against the TSC; in a TCG
# guest on a busy host that estimate sometimes fails ("Correlation coefficient r^2: 0.88 < 0.9").
# Without -F perftest then exits 1 ("Can't produce a report") after a transfer that went fine; CI
# once lost ib_send_bw that way twice running. With -F it exits by its transfer's result and
# reports 0 MB/s, which perftest_figure turns into "unknown". -F changes nothing else (it also
# silences a cpufreq warning).
PERFTEST_OPTS=(-F)

# perftest_figure HOST NAME FIELD: from a perftest bandwidth report line
# (#bytes #iterations BW-peak BW-average MsgRate), FIELD 2 = iterations, 4 = average MB/s. A rate
# (FIELD 3-5) is "unknown" when perftest could not estimate the clock (see PERFTEST_OPTS).
perftest_figure() {
  local log=$SCEN_DIR/$1/$2.log
  if (($3 >= 3)) && grep -qs 'Correlation coefficient' "$log"; then
    echo unknown
    return
  fi
  awk -v f="$3" '$1 ~ /^[0-9]+$/ && NF >= 5 && $3 ~ /^[0-9.]+$/ {v = $f} END {if (v != "") print v}' \
    "$log"
}

# perftest_pair TEST SIZE ITERS [EXTRA-ARGS...]: the perftest program TEST (ib_write_bw...) as
# server on B and client on A over rxe0 (GID index 1 = RoCEv2 IPv4), bootstrap over mgmt.
# Both must exit 0; figures: MBps (client's average bandwidth) and iters.
perftest_pair() {
  local test=$1 size=$2 iters=$3
  shift 3
  local common=(-d rxe0 -x 1 -s "$size" -n "$iters" -p "$LAB_PORT" "${PERFTEST_OPTS[@]}" "$@")
  app B srv -- "$test" "${common[@]}"
  wait_listen B "$LAB_PORT" 30 || lab_fail "$test server on B is not listening on $LAB_PORT"
  app A cli -- "$test" "${common[@]}" "$(ip_of B mgmt)"
  local rc=0
  wait_jobs "${PERFTEST_TIMEOUT:-90}" A:cli B:srv || rc=1
  local bw it
  bw=$(perftest_figure A cli 4)
  it=$(perftest_figure A cli 2)
  [[ -n $bw ]] && figure MBps "$bw"
  [[ -n $it ]] && figure iters "$it"
  if ((rc)); then
    note "$test: client rc=$(job_rc A cli) server rc=$(job_rc B srv)"
    return 1
  fi
  [[ -n $bw ]] || {
    note "$test: no bandwidth line in the client's output"
    return 1
  }
}

# ---- failover statistics (the shim's VERBS_FAILOVER_STATS files, see docs/lab.md) -------------
# In a shim variant every app() job writes $SCEN_DIR/HOST/stats.HOST.NAME.<pid>.json at exit;
# lib/failover_stats.py reads them on the host.

_failover_stats() { python3 "$LAB_DIR/lib/failover_stats.py" "$@"; }

# assert_failover HOST JOB: the job's stats show totals.failovers >= 1 and every failover/failback
# event resumed (resumed_unix_ns > 0). Otherwise a note saying what is missing, and status 1.
assert_failover() {
  local out rc=0
  out=$(_failover_stats check "$SCEN_DIR" "$1" "$2" --failover) || rc=$?
  ((rc == 0)) && { log "stats $1:$2: failover recorded and resumed"; return 0; }
  note "${out:-stats of $1:$2 could not be checked (status $rc)}"
  return 1
}

# assert_stats HOST JOB EXPR...: each Python expression holds for every stats file of the job,
# with s = the file's object and helpers qps(s), dev(s, NAME), totals(s); e.g.
#   assert_stats A p1 'totals(s)["failovers"] == 0' 'dev(s, "rxe0").get("state") == "DOWN"'
assert_stats() {
  local h=$1 j=$2 e out rc=0 args=()
  shift 2
  for e in "$@"; do args+=(--expect "$e"); done
  out=$(_failover_stats check "$SCEN_DIR" "$h" "$j" "${args[@]}") || rc=$?
  ((rc == 0)) && { log "stats $h:$j: $*: hold"; return 0; }
  note "${out:-stats of $h:$j could not be checked (status $rc)}"
  return 1
}

# failover_figures HOST [JOB...]: fault-to-resume time of each fault injected on HOST (the latest
# first completion on the standby among the failovers of HOST's jobs after that fault, minus the
# fault's time, both on HOST's clock; an upper bound, at most err_ms too high), and the shim's own
# detection-to-first-completion "ms" (median and max over every failover of both hosts). Adds the
# figures fault_to_resume_ms, err_ms, failover_ms, failover_ms_max, and peer_request_ms (median,
# over the failovers a peer asked for: its request's arrival to the first completion here); the
# full table goes to $SCEN_DIR/failover_times.txt. Sets FAILOVER_RESUME_MS (one value per fault, "-" if none).
FAILOVER_RESUME_MS=()
failover_figures() {
  local out line resume err
  FAILOVER_RESUME_MS=()
  out=$(_failover_stats times "$SCEN_DIR" "$@") || { note "failover_stats.py times failed"; return 1; }
  printf '%s\n' "$out" >"$SCEN_DIR/failover_times.txt"
  local errs=()
  while read -r line; do
    case $line in
      fault\ *)
        log "timing: $line"
        resume=$(grep -o ' resume_ms=[^ ]*' <<<"$line" | cut -d= -f2)
        err=$(grep -o ' err_ms=[^ ]*' <<<"$line" | cut -d= -f2)
        FAILOVER_RESUME_MS+=("${resume:--}")
        errs+=("$err")
        ;;
      failover_ms_median\ *) figure failover_ms "${line#* }" ;;
      failover_ms_max\ *) figure failover_ms_max "${line#* }" ;;
      peer_request_ms_median\ *) figure peer_request_ms "${line#* }" ;;
    esac
  done <<<"$out"
  if ((${#FAILOVER_RESUME_MS[@]})); then
    local IFS=,
    figure fault_to_resume_ms "${FAILOVER_RESUME_MS[*]}"
    figure err_ms "${errs[*]}"
  fi
}
