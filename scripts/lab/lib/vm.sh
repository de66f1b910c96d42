# shellcheck shell=bash
# Booting, checking and killing the two lab VMs. State of the current boot lives in globals and in
# $CTL_ROOT/<host>/ (the agents' control folders, reachable by the guests over 9p; one per boot,
# kept with that boot's logs).

declare -A VM_PID=()   # QEMU PID per host; empty when that VM is not running
declare -A VM_MON=()   # QEMU monitor socket per host
VM_BOOT=0              # boot counter, names the boot-<n> log folder
CTL_ROOT=""            # <results>/boot-<n>/ctl
VM_SOCK_DIR=""         # host-only folder for monitor sockets (short path: sun_path is 108 bytes)
declare -A NET_PORT=() # "<host>:<net>" -> local UDP port of that host's NIC on that network

# Six consecutive UDP ports below the ephemeral range, chosen at random and proven free by binding
# them all; a fresh set per boot means a run never collides with a previous or concurrent one.
pick_ports() {
  python3 - <<'EOF'
import random, socket, sys
for _ in range(200):
    base = random.randrange(20000, 32000, 8)
    socks = []
    try:
        for port in range(base, base + 6):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no free block of 6 UDP ports on 127.0.0.1")
EOF
}

vm_boot() {
  local kver kroot
  kver=$(cached_kernel_version) || die "no kernel in $LAB_CACHE; run 'lab prepare'"
  kroot=$LAB_CACHE/kernel/$kver
  local initrd=$LAB_CACHE/initramfs-$kver.cpio.gz
  [[ -r $initrd ]] || die "no initramfs in $LAB_CACHE; run 'lab prepare'"
  VM_BOOT=$((VM_BOOT + 1))
  BOOT_DIR=$RUN_DIR/boot-$VM_BOOT
  CTL_ROOT=$BOOT_DIR/ctl
  mkdir -p "$BOOT_DIR"
  [[ -n $VM_SOCK_DIR ]] || VM_SOCK_DIR=$(mktemp -d /tmp/vflab.XXXXXX)
  local base
  base=$(pick_ports) || die "cannot find free UDP ports"
  local i=0 net
  for net in mgmt rail0 rail1; do
    NET_PORT[A:$net]=$((base + i))
    NET_PORT[B:$net]=$((base + 3 + i))
    i=$((i + 1))
  done
  log "boot $VM_BOOT: UDP ports $base..$((base + 5)), logs in $BOOT_DIR"
  local h
  for h in A B; do
    vm_start "$h" "$kver" "$kroot" "$initrd"
  done
  local deadline=$(($(now_ms) + ${VF_LAB_BOOT_TIMEOUT:-240} * 1000))
  for h in A B; do
    until [[ -e $CTL_ROOT/$h/ready ]]; do
      if [[ -e $CTL_ROOT/$h/failed ]]; then
        log "host $h failed to boot: $(<"$CTL_ROOT/$h/failed")"
        return 1
      fi
      if ! vm_alive "$h"; then
        log "host $h: QEMU exited during boot (see $BOOT_DIR/$h.console.log)"
        return 1
      fi
      if (($(now_ms) > deadline)); then
        log "host $h not ready after ${VF_LAB_BOOT_TIMEOUT:-240} s (see $BOOT_DIR/$h.console.log)"
        return 1
      fi
      sleep 0.2
    done
  done
  # Both sides up is not enough: prove every link carries packets before any scenario relies on it.
  local checks=()
  for net in mgmt rail0 rail1; do
    checks+=("/bin/busybox ping -c 1 -W 10 $(ip_of B "$net") >/dev/null || { echo 'no path to B on $net'; exit 1; }")
  done
  local IFS=';'
  if ! boot_job A linkcheck 40 "${checks[*]}"; then
    log "link check A->B failed (see $BOOT_DIR)"
    return 1
  fi
  log "boot $VM_BOOT: both hosts ready, links checked"
}

# The lab's own folders that the guests' tmpfs mounts (/tmp /run /var/tmp /dev/shm) would hide,
# comma-separated: a checkout under /tmp (as a CI clone may be) still works, because the guest
# binds these back from the host root (guest/init.sh, vf.keep=).
guest_kept_paths() {
  local p out=() seen=" " shim_dirs=()
  # The shim's folder, and the build tree above it: scenarios run its test programs from ../bin.
  [[ -n ${VF_SHIM:-} ]] && shim_dirs=("$(dirname "$VF_SHIM")" "$(dirname "$(dirname "$VF_SHIM")")")
  for p in "$REPO_DIR" "$LAB_RESULTS_BASE" "$LAB_CACHE" "${shim_dirs[@]}"; do
    p=$(realpath -m "$p")
    case $p in
      /tmp/* | /run/* | /var/tmp/* | /dev/shm/*) ;;
      *) continue ;;
    esac
    [[ $p != *[[:space:],]* ]] || die "path '$p' holds a space or comma; the guests cannot be given it"
    [[ $seen == *" $p "* ]] || out+=("$p")
    seen+="$p "
  done
  local IFS=,
  printf '%s' "${out[*]}"
}

vm_start() {
  local h=$1 kver=$2 kroot=$3 initrd=$4
  local ctl=$CTL_ROOT/$h
  rm -rf "$ctl"
  mkdir -p "$ctl/cmd" "$ctl/run" "$ctl/kill"
  VM_MON[$h]=$VM_SOCK_DIR/$h.mon
  rm -f "${VM_MON[$h]}"
  local peer=B
  [[ $h == B ]] && peer=A
  local args=(
    -name "vf-lab-$h" -accel tcg -cpu max -smp 1 -m "${VF_LAB_MEM:-1024}"
    -nodefaults -no-user-config -display none -no-reboot -nic none
    -kernel "$kroot/boot/vmlinuz-$kver" -initrd "$initrd"
    # virtio_net.napi_tx=0: a sent frame releases its socket (and rxe's reference on the QP that
    # sent it) when the driver takes it, as real NIC drivers do when their port goes down. With
    # NAPI transmit, frames the device had consumed but the driver had not yet reaped stay in the
    # ring of a port set down, each holding its QP: the application's ibv_destroy_qp then waits
    # rxe's 50 s timeout per QP (seen once: cut_port_down_srq_pingpong, 16 QPs, VM killed).
    -append "console=ttyS0 panic=-1 net.ifnames=0 ipv6.disable=1 virtio_net.napi_tx=0 vf.host=$h vf.ctl=$ctl vf.kroot=$kroot vf.kver=$kver vf.init=$LAB_DIR/guest/init.sh vf.keep=$(guest_kept_paths)"
    -serial "file:$BOOT_DIR/$h.console.log"
    -monitor "unix:${VM_MON[$h]},server,nowait"
    -virtfs "local,path=/,mount_tag=hostroot,security_model=passthrough,multidevs=remap,id=hostroot"
  )
  local i=0 net mac
  for net in mgmt rail0 rail1; do
    mac=$(printf '52:54:00:18:%02x:%02x' "$i" "${LAB_HOST_OCTET[$h]}")
    # Unicast UDP on loopback: each NIC sends to its peer's port and receives on its own.
    args+=(
      -netdev "socket,id=$net,udp=127.0.0.1:${NET_PORT[$peer:$net]},localaddr=127.0.0.1:${NET_PORT[$h:$net]}"
      -device "virtio-net-pci,netdev=$net,mac=$mac,romfile=,addr=$((3 + i))"
    )
    i=$((i + 1))
  done
  printf '%q ' qemu-system-x86_64 "${args[@]}" >"$BOOT_DIR/$h.qemu-cmdline"
  # The parent-death signal takes QEMU down with the runner even when the runner cannot clean up
  # (SIGKILL from a test driver's timeout).
  setpriv --pdeathsig KILL qemu-system-x86_64 "${args[@]}" </dev/null >"$BOOT_DIR/$h.qemu.log" 2>&1 &
  VM_PID[$h]=$!
  echo "${VM_PID[$h]}" >"$BOOT_DIR/$h.qemu.pid"
}

vm_alive() {
  local pid=${VM_PID[$1]:-}
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# Kill one VM by its PID: TERM, then KILL if QEMU has not gone within 5 s.
vm_kill() {
  local h=$1 pid=${VM_PID[$1]:-}
  [[ -n $pid ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || :
    poll_until 5 eval "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || :
  fi
  wait "$pid" 2>/dev/null || :
  VM_PID[$h]=""
}

vm_shutdown_all() {
  vm_kill A
  vm_kill B
}

# A job during boot, outside any scenario (the link check); output goes to the boot folder.
boot_job() {
  local h=$1 name=$2 timeout=$3 script=$4
  job_submit "$h" "$name" "$BOOT_DIR/$h.$name.log" "$script"
  job_wait_id "$h" "$JOB_ID" "$timeout"
}

# Send one human-monitor command to a host's QEMU; prints QEMU's answer.
vm_monitor() {
  local h=$1
  shift
  python3 - "${VM_MON[$h]}" "$*" <<'EOF'
import socket, sys
path, command = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(path)
def until_prompt():
    data = b""
    while not data.endswith(b"(qemu) "):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")
until_prompt()
s.sendall(command.encode() + b"\n")
reply = until_prompt()
# The monitor echoes the command line with terminal escapes; keep only the answer lines.
lines = [l for l in reply.replace("\r", "").split("\n")[1:] if l and not l.startswith("(qemu)")]
print("\n".join(lines))
EOF
}
