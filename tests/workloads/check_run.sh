#!/usr/bin/env bash
# Runs a workload command and checks its outcome beyond the exit status:
#   check_run.sh pass RANKS COMMAND...  exit 0 and exactly RANKS "PASS" summary lines, no FAIL
#   check_run.sh fail REGEX COMMAND...  non-zero exit and a line matching REGEX (the clear message)
# The command's stdout and stderr are both checked and echoed.
#   CHECK_RUN_STATS="failovers>=1 failbacks>=1": with the shim, the run writes its stats file
#   (VERBS_FAILOVER_STATS is set here) and each total named must reach the given minimum — the
#   proof that a failover really happened and the pass is not a run the fault never touched
#   ("failbacks<=0": at most that many).
set -u
mode=$1 arg=$2
shift 2
stats_dir=
if [[ -n ${CHECK_RUN_STATS:-} ]]; then
  stats_dir=$(mktemp -d)
  trap 'rm -rf "$stats_dir"' EXIT
  export VERBS_FAILOVER_STATS="$stats_dir/stats.%p.json"
fi
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
    fi
    if [[ -n $stats_dir ]]; then
      python3 - "$stats_dir" $CHECK_RUN_STATS <<'PY' || exit 1
import glob, json, sys
files = glob.glob(sys.argv[1] + "/stats.*.json")
if len(files) != 1:
    sys.exit(f"check_run: expected one stats file, found {len(files)}")
totals = json.load(open(files[0]))["totals"]
print("check_run: stats totals", totals)
for rule in sys.argv[2:]:
    op = ">=" if ">=" in rule else "<="
    name, bound = rule.split(op)
    value = totals.get(name, 0)
    if (value < int(bound)) if op == ">=" else (value > int(bound)):
        sys.exit(f"check_run: stats {name}={value}, expected {op} {bound}")
PY
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
