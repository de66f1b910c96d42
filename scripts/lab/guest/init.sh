#!/bin/bash
# Stage 2 of a lab guest, PID 1 on the host's root (shared over 9p, same paths as on the host).
# Makes the guest private where it would otherwise write into the host (tmpfs), loads Soft-RoCE
# from the unpacked Debian kernel, configures the three networks and becomes the job agent.
# Readiness and failure are reported as files in the control folder the host named on the cmdline.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp/home LC_ALL=C

host='' ctl='' kroot='' kver='' keep=''
for word in $(</proc/cmdline); do
  case $word in
    vf.host=*) host=${word#vf.host=} ;;
    vf.ctl=*) ctl=${word#vf.ctl=} ;;
    vf.kroot=*) kroot=${word#vf.kroot=} ;;
    vf.kver=*) kver=${word#vf.kver=} ;;
    vf.keep=*) keep=${word#vf.keep=} ;;
  esac
done

say() { echo "vf-lab guest $host: $*"; }
halt_with() {
  say "FAILED: $*"
  [[ -n $ctl && -d $ctl ]] && printf '%s\n' "$*" >"$ctl/failed"
  # PID 1 must never return; powering off makes QEMU exit, which the host notices at once.
  /bin/busybox poweroff -f
  exec /bin/busybox sleep 1000000
}
[[ -n $host && -n $ctl && -n $kroot && -n $kver ]] || halt_with "incomplete vf.* kernel parameters"

# Everything that writes must stay inside the guest: the 9p root is the host's live filesystem.
# The lab's own folders under those paths (vf.keep=, e.g. a checkout in /tmp) are bound back from
# a view of the host root kept on /mnt before the tmpfs mounts hide them.
if [[ -n $keep ]]; then
  [[ -d /mnt ]] || halt_with "no /mnt on the host root to keep ${keep} visible"
  mount --bind / /mnt || halt_with "bind of the host root on /mnt"
fi
for d in /tmp /run /var/tmp /var/log; do
  mount -t tmpfs -o mode=1777 tmpfs "$d" || halt_with "tmpfs on $d"
done
IFS=, read -ra kept <<<"$keep"
for p in "${kept[@]}"; do
  { mkdir -p "$p" && mount --bind "/mnt$p" "$p"; } || halt_with "bind of $p from the host"
done
mkdir -p /dev/pts /dev/shm /tmp/home
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ln -sfn /proc/self/fd /dev/fd
hostname "vf-lab-$host"

# Modules live in the cache, not in /lib/modules; the kernel's own on-demand loading (tc qdiscs,
# netfilter) goes through the same wrapper.
mkdir -p /run/vf-lab
printf '%s\n' "$kroot" >/run/vf-lab/kroot
# A FIFO nobody writes to: `read -t` on it is a poll interval that costs no fork under emulation.
mkfifo /run/vf-lab/tick
exec {tick}<>/run/vf-lab/tick
nap() { read -r -t "$1" -u "$tick" || :; }
echo "$(dirname "$0")/modprobe-wrapper" >/proc/sys/kernel/modprobe
for m in rdma_rxe sch_netem sch_ingress cls_matchall act_gact; do
  modprobe -d "$kroot" -S "$kver" "$m" || halt_with "modprobe $m"
done

# Frames in flight must not hold their QPs when a port goes down (docs/lab.md, "When a run stalls").
[[ $(cat /sys/module/virtio_net/parameters/napi_tx) == N ]] ||
  halt_with "virtio_net loaded with napi_tx on: the initramfs did not pass virtio_net.napi_tx=0"

declare -A octet=([A]=1 [B]=2)
[[ -n ${octet[$host]:-} ]] || halt_with "unknown host name $host"
ip link set lo up
i=0
for net in 0 1 2; do
  dev=eth$i
  [[ -e /sys/class/net/$dev ]] || halt_with "$dev missing"
  # The host gives NIC k the MAC 52:54:00:18:0k:0h; a different order would swap rails silently.
  want=$(printf '52:54:00:18:%02x:%02x' "$net" "${octet[$host]}")
  have=$(</sys/class/net/$dev/address)
  [[ $have == "$want" ]] || halt_with "$dev has MAC $have, expected $want"
  ip addr add "198.18.$net.${octet[$host]}/24" dev "$dev" || halt_with "address on $dev"
  ip link set "$dev" up || halt_with "link up $dev"
  i=$((i + 1))
done
rdma link add rxe0 type rxe netdev eth1 || halt_with "rdma link add rxe0"
rdma link add rxe1 type rxe netdev eth2 || halt_with "rdma link add rxe1"

deadline=$((SECONDS + 30))
for dev in rxe0 rxe1; do
  until grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null; do
    ((SECONDS < deadline)) || halt_with "$dev port not ACTIVE"
    nap 0.1
  done
done

{
  ip -br addr
  rdma link show
  for dev in rxe0 rxe1; do
    for g in "/sys/class/infiniband/$dev/ports/1/gids"/*; do
      n=${g##*/}
      gid=$(<"$g")
      [[ $gid == 0000:0000:0000:0000:0000:0000:0000:0000 ]] && continue
      echo "$dev gid[$n] $gid $(<"/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$n" 2>/dev/null)"
    done
  done
} >"$ctl/setup.txt" 2>&1

say "ready"
touch "$ctl/ready"
# The agent runs with a real-time priority so that the host's requests (start a fault, read the
# clock, end a job) are served at once even while the workloads keep the one CPU busy; it starts
# every job back at the normal policy (agent.sh).
exec chrt -f 10 /bin/bash "$(dirname "$0")/agent.sh" "$ctl"
