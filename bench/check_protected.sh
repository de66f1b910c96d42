#!/usr/bin/env bash
# Asserts that, under the shim, post_poll_bench runs on the protected data path: both of its QPs
# log "qp N: protected — standby qp ..." at VERBS_FAILOVER_LOG=info and none is unprotected, and
# the benchmark prints all its figures. Without this a change (a device without a backup, a QP
# type the shim does not protect) would make the figures measure pass-through without notice.
# Usage: bench/check_protected.sh BENCH FAKE_LIB_DIR SHIM [iterations]
set -uo pipefail
bench=$1 fake_dir=$2 shim=$3 iterations=${4:-1000}
out=$(LD_LIBRARY_PATH="$fake_dir" LD_PRELOAD="$shim" VERBS_FAILOVER_LOG=info "$bench" "$iterations" 2>&1)
status=$?
protected=$(grep -cE 'qp [0-9]+: protected — standby qp [0-9]+ on ' <<<"$out")
problems=0
if [ "$status" -ne 0 ]; then echo "check_protected: the benchmark failed (exit $status)"; problems=1; fi
if [ "$protected" -ne 2 ]; then
  echo "check_protected: expected 2 'protected — standby qp' lines, found $protected"; problems=1
fi
if grep -qE 'qp [0-9]+: unprotected' <<<"$out"; then echo "check_protected: a QP is unprotected"; problems=1; fi
figures="empty_poll_ns=[0-9.]+ post_send_ns=[0-9.]+ send_poll_ns=[0-9.]+ post_recv_ns=[0-9.]+ recv_poll_ns=[0-9.]+"
figures+=" empty_poll_p50_ns=[0-9.]+ post_send_p50_ns=[0-9.]+ send_poll_p50_ns=[0-9.]+"
figures+=" post_recv_p50_ns=[0-9.]+ recv_poll_p50_ns=[0-9.]+ iterations=$iterations"
if ! grep -qE "$figures" <<<"$out"; then
  echo "check_protected: the benchmark's figures line is missing"; problems=1
fi
# The baseline runs (no shim, --idle-pair: the fake's fabric then holds as many connected QPs as
# under the shim) must work too, or bench/run.sh would have nothing to compare with.
baseline=$(LD_LIBRARY_PATH="$fake_dir" "$bench" "$iterations" --idle-pair 2>&1)
status=$?
if [ "$status" -ne 0 ] || ! grep -qE "$figures" <<<"$baseline"; then
  echo "check_protected: the baseline run (no shim, --idle-pair) failed (exit $status): $baseline"
  problems=1
fi
if [ "$problems" -ne 0 ]; then
  printf '%s\n' "--- output ---" "$out"
  exit 1
fi
grep -E 'protected — standby qp' <<<"$out"
echo "check_protected: OK (both QPs protected)"
