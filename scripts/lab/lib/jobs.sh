# shellcheck shell=bash
# Host side of the agent protocol (see guest/agent.sh): submit a job, wait for it, end it by PID.

JOB_SEQ=0
JOB_PREFIX=boot # scenario runs replace this so their jobs can be told apart at cleanup

# job_submit HOST NAME LOGFILE SCRIPT-TEXT -> sets JOB_ID (not printed: the sequence counter must
# survive, which a command substitution would not allow).
# The job runs SCRIPT-TEXT with bash inside HOST, all output appended to LOGFILE (a host path; the
# guest sees the same path).
job_submit() {
  local h=$1 name=$2 logfile=$3 script=$4
  JOB_SEQ=$((JOB_SEQ + 1))
  local id=$JOB_PREFIX-$JOB_SEQ-$name
  local dir=$CTL_ROOT/$h/cmd
  mkdir -p "$(dirname "$logfile")"
  {
    printf '#!/bin/bash\n'
    printf 'exec >>%q 2>&1\n' "$logfile"
    printf 'cd %q || exit 125\n' "$(dirname "$logfile")"
    printf '%s\n' "$script"
  } >"$dir/.$id.tmp"
  # The agent only looks at *.sh, so the rename makes the whole script appear at once.
  mv "$dir/.$id.tmp" "$dir/$id.sh"
  JOB_ID=$id
}

# Exit status of a job, or nothing while it runs.
job_rc_id() {
  local f=$CTL_ROOT/$1/run/$2.rc
  [[ -r $f ]] && cat "$f"
}

# job_wait_id HOST ID TIMEOUT: returns the job's exit status; 124 if it is still running at the
# deadline; 125 if the VM is gone. Sets WAIT_TIMED_OUT for callers that must tell 124 apart.
job_wait_id() {
  local h=$1 id=$2 timeout=$3
  local f=$CTL_ROOT/$h/run/$id.rc
  local deadline=$(($(now_ms) + timeout * 1000))
  WAIT_TIMED_OUT=0
  until [[ -s $f ]]; do
    if ! vm_alive "$h"; then
      log "host $h: VM is not running (job $id)"
      return 125
    fi
    if (($(now_ms) > deadline)); then
      WAIT_TIMED_OUT=1
      return 124
    fi
    sleep 0.1
  done
  return "$(<"$f")"
}

# Ask the agent to end a job's process group and wait (bounded) until it reports the exit status.
# An agent that cannot do that within 15 s means a wedged guest: its VM is killed by PID.
# job_kill_id HOST ID stacks: the agent first describes every thread of the job in
# run/ID.stacks (gdb may take up to 30 s per process of it, so the wait is longer).
job_kill_id() {
  local h=$1 id=$2 request=${3:-} bound=15
  [[ -s $CTL_ROOT/$h/run/$id.rc ]] && return 0
  vm_alive "$h" || return 0
  [[ $request == stacks ]] && bound=75
  printf '%s' "$request" >"$CTL_ROOT/$h/kill/.$id.tmp"
  mv "$CTL_ROOT/$h/kill/.$id.tmp" "$CTL_ROOT/$h/kill/$id"
  local rc=0
  job_wait_id "$h" "$id" "$bound" || rc=$?
  if ((rc == 124)); then
    log "host $h: job $id did not end after kill; killing the VM (PID ${VM_PID[$h]})"
    vm_kill "$h"
    return 1
  fi
  return 0
}

# Jobs of one prefix that have started but not ended (on either host), as "HOST ID" lines.
jobs_running() {
  local prefix=$1 h f id
  for h in A B; do
    for f in "$CTL_ROOT/$h/run/$prefix"-*.sh "$CTL_ROOT/$h/cmd/$prefix"-*.sh; do
      [[ -e $f ]] || continue
      id=$(basename "$f" .sh)
      [[ -s $CTL_ROOT/$h/run/$id.rc ]] || printf '%s %s\n' "$h" "$id"
    done
  done
}
