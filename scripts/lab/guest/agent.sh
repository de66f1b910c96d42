#!/bin/bash
# The job agent of a lab guest (PID 1 after setup). The host drives it only through files in the
# control folder, which both sides see over 9p:
#   cmd/<id>.sh      dropped by the host (written elsewhere, then renamed in): a job to start
#   run/<id>.sh      the job once taken; run/<id>.pid its PID (= its process group and session)
#   run/<id>.rc      its exit status, written when it has ended
#   kill/<id>        the host asks for the job's whole process group to be ended; a file that
#                    says "stacks" first has every thread of the group described in
#                    run/<id>.stacks (a hung job: where each thread waits or spins)
# Jobs run in their own session so that ending one ends everything it started, and nothing else.
set -u
ctl=$1
mkdir -p "$ctl/cmd" "$ctl/run" "$ctl/kill"
exec {tick}<>/run/vf-lab/tick
nap() { read -r -t "$1" -u "$tick" || :; }

start_job() {
  local f=$1 id
  id=$(basename "$f" .sh)
  mv "$f" "$ctl/run/$id.sh" || return
  (
    # The agent itself is real-time (init.sh); its jobs run with the normal policy.
    chrt -o 0 setsid /bin/bash "$ctl/run/$id.sh" </dev/null >>"$ctl/run/$id.agent.log" 2>&1 &
    pid=$!
    echo "$pid" >"$ctl/run/$id.pid.tmp" && mv "$ctl/run/$id.pid.tmp" "$ctl/run/$id.pid"
    wait "$pid"
    echo "$?" >"$ctl/run/$id.rc.tmp" && mv "$ctl/run/$id.rc.tmp" "$ctl/run/$id.rc"
  ) &
}

# The fields of a /proc stat file after "PID (comm) " into STAT: STAT[0] the state, STAT[2] the
# process group, STAT[11] + STAT[12] the CPU ticks used (user + system). False if it is gone.
read_stat() {
  local line
  { line=$(<"$1"); } 2>/dev/null || return 1
  read -r -a STAT <<<"${line##*) }"
}

# Every thread of a process group: its state (R: running), where the kernel has it, its system
# call, the CPU time it uses in the next second (a hung thread that uses CPU spins), and, with gdb
# at hand, its user stack.
describe_group() {
  local pgid=$1 stat p t
  local -A ticks=()
  for stat in /proc/[0-9]*/stat; do
    if ! read_stat "$stat" || [[ ${STAT[2]} != "$pgid" ]]; then continue; fi
    p=${stat#/proc/}
    p=${p%/stat}
    echo "== process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
    for t in /proc/"$p"/task/*; do
      read_stat "$t/stat" || continue
      ticks[$t]=$((STAT[11] + STAT[12]))
      echo "-- thread ${t##*/} ($(<"$t/comm")): state ${STAT[0]}, wchan $(<"$t/wchan"), syscall $(<"$t/syscall")"
      sed 's/^/   kernel: /' "$t/stack" 2>/dev/null
    done
    nap 1
    for t in "${!ticks[@]}"; do
      read_stat "$t/stat" || continue
      echo "-- thread ${t##*/}: $((STAT[11] + STAT[12] - ticks[$t])) CPU ticks in the next second"
    done
    ticks=()
    if command -v gdb >/dev/null; then
      timeout 30 gdb -p "$p" -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 |
        grep -E '^(Thread|#)' | sed 's/^/   gdb: /'
    fi
  done
}

# TERM first so programs can flush their logs; KILL the group if it is still there 3 s later.
kill_job() {
  local id=$1 stacks=$2 pid
  [[ -r $ctl/run/$id.pid ]] || return 0
  pid=$(<"$ctl/run/$id.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  (
    if [[ $stacks == stacks ]]; then
      chrt -o -p 0 "$BASHPID" 2>/dev/null # the agent is real-time; gdb must not be
      # In a subshell of its own: whatever goes wrong in it, the job is still ended.
      (describe_group "$pid") >"$ctl/run/$id.stacks.tmp" 2>&1
      mv "$ctl/run/$id.stacks.tmp" "$ctl/run/$id.stacks"
    fi
    kill -TERM -- "-$pid" 2>/dev/null || exit 0
    for _ in $(seq 30); do
      kill -0 -- "-$pid" 2>/dev/null || exit 0
      nap 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null
  ) &
}

echo "vf-lab agent: serving $ctl"
while :; do
  for f in "$ctl"/cmd/*.sh; do
    [[ -e $f ]] || break
    start_job "$f"
  done
  for f in "$ctl"/kill/*; do
    [[ -e $f ]] || break
    id=${f##*/}
    # A request can overtake the job's start; it stays until there is a PID to act on.
    if [[ -s $ctl/run/$id.pid ]]; then
      request=$(<"$f")
      rm -f "$f"
      kill_job "$id" "$request"
    elif [[ -s $ctl/run/$id.rc ]]; then
      rm -f "$f"
    fi
  done
  nap 0.1
done
