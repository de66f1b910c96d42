#!/usr/bin/env bash
# Runs a workload command and checks its outcome beyond the exit status:
#   check_run.sh pass RANKS COMMAND...  exit 0 and exactly RANKS "PASS" summary lines, no FAIL
#   check_run.sh fail REGEX COMMAND...  non-zero exit and a line matching REGEX (the clear message)
# The command's stdout and stderr are both checked and echoed.
set -u
mode=$1 arg=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
case $mode in
  pass)
    passes=$(grep -c '^nccl_pattern: rank [0-9]* PASS ' <<<"$out")
    if [[ $rc -ne 0 || $passes -ne $arg ]] || grep -q ' FAIL ' <<<"$out"; then
      echo "check_run: expected exit 0 and $arg PASS lines, got exit $rc and $passes PASS lines" >&2
      exit 1
    fi
    # CHECK_RUN_ALSO: a further line the output must hold (e.g. proof that the shim was loaded).
    if [[ -n ${CHECK_RUN_ALSO:-} ]] && ! grep -Eq -- "$CHECK_RUN_ALSO" <<<"$out"; then
      echo "check_run: no line matches: $CHECK_RUN_ALSO" >&2
      exit 1
    fi ;;
  fail)
    if [[ $rc -eq 0 ]]; then
      echo "check_run: expected a non-zero exit, got 0: the failure was not detected" >&2
      exit 1
    fi
    if ! grep -Eq -- "$arg" <<<"$out"; then
      echo "check_run: exit $rc, but no line matches: $arg" >&2
      exit 1
    fi ;;
  *) echo "check_run: unknown mode $mode" >&2; exit 2 ;;
esac
echo "check_run: OK ($mode, exit $rc)"
