# shellcheck shell=bash
# Paths and small helpers shared by every host-side part of the lab. Sourced by scripts/lab/lab.

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_DIR=$(cd "$LAB_DIR/../.." && pwd)
LAB_CACHE=${VF_LAB_CACHE:-$REPO_DIR/lab-cache}
LAB_RESULTS_BASE=${VF_LAB_RESULTS:-$REPO_DIR/lab-results}
VF_SHIM=${VF_SHIM:-$REPO_DIR/build/lib/libverbs_failover.so}

# Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking) so nothing can ever be confused with a
# real network; the last octet is 1 for host A and 2 for host B.
declare -A LAB_NET_PREFIX=([mgmt]=198.18.0 [rail0]=198.18.1 [rail1]=198.18.2)
declare -A LAB_NET_IFACE=([mgmt]=eth0 [rail0]=eth1 [rail1]=eth2)
declare -A LAB_NET_RXE=([rail0]=rxe0 [rail1]=rxe1)
declare -A LAB_HOST_OCTET=([A]=1 [B]=2)

log() { printf '[lab %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# A wall clock with sub-second resolution that needs no fork.
now() { printf '%s' "${EPOCHREALTIME}"; }
# Integer milliseconds since the epoch, for deadline arithmetic in bash.
now_ms() {
  local t=${EPOCHREALTIME}
  printf '%s' "$((${t%.*} * 1000 + 10#${t#*.} / 1000))"
}

# Bounded poll: evaluate "$@" every 0.1 s until it succeeds or TIMEOUT seconds pass.
poll_until() {
  local timeout=$1
  shift
  local deadline=$(($(now_ms) + timeout * 1000))
  until "$@"; do
    (($(now_ms) < deadline)) || return 1
    sleep 0.1
  done
}

kernel_package() {
  # linux-image-amd64 is a metapackage; its single linux-image-<abi>-amd64 dependency is the kernel.
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9].*-amd64$/ && !found {print $2; found = 1}'
}

# The kernel the cache currently holds (written by prepare), so `run` needs no apt metadata.
cached_kernel_version() {
  [[ -r $LAB_CACHE/kernel-version ]] && cat "$LAB_CACHE/kernel-version"
}
