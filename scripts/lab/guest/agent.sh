#!/bin/bash
# The job agent of a lab guest (PID 1 after setup). The host drives it only through files in the
# control folder, which both sides see over 9p:
#   cmd/<id>.sh      dropped by the host (written elsewhere, then renamed in): a job to start
#   run/<id>.sh      the job once taken; run/<id>.pid its PID (= its process group and session)
#   run/<id>.rc      its exit status, written when it has ended
#   kill/<id>        the host asks for the job's whole process group to be ended
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

# TERM first so programs can flush their logs; KILL the group if it is still there 3 s later.
kill_job() {
  local id=$1 pid
  [[ -r $ctl/run/$id.pid ]] || return 0
  pid=$(<"$ctl/run/$id.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  (
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
      rm -f "$f"
      kill_job "$id"
    elif [[ -s $ctl/run/$id.rc ]]; then
      rm -f "$f"
    fi
  done
  nap 0.1
done
