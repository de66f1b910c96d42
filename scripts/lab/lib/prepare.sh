# shellcheck shell=bash
# `lab prepare`: host packages, a Debian kernel with rdma_rxe unpacked into the cache, and the
# busybox initramfs. Idempotent and cheap when everything is already there, so `lab run` calls it too.
# It never writes outside the cache: the host's /boot and /lib/modules are left alone.

LAB_PACKAGES=(
  qemu-system-x86 busybox-static kmod cpio gzip coreutils procps
  rdma-core ibverbs-utils ibverbs-providers perftest rdmacm-utils
  iproute2 iptables python3
  gdb # describes the threads of a process that hangs under the shim (guest/agent.sh)
)

# Modules the initramfs loads itself, before the host root (and with it modprobe) is reachable.
# Listed by name; their dependencies are resolved with modprobe against the unpacked tree.
INITRAMFS_MODULES=(virtio_pci virtio_net 9pnet_virtio 9p)

apt_updated=0
apt_update_once() {
  if ((!apt_updated)); then
    log "apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
}

prepare_packages() {
  local missing=() p
  for p in "${LAB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    [[ $(id -u) -eq 0 ]] || die "missing packages ${missing[*]}; run 'lab prepare' as root"
    apt_update_once
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

prepare_kernel() {
  local pkg
  pkg=$(kernel_package)
  if [[ -z $pkg ]]; then
    apt_update_once
    pkg=$(kernel_package)
  fi
  [[ -n $pkg ]] || die "apt-cache cannot resolve linux-image-amd64 to a kernel package"
  local kver=${pkg#linux-image-}
  local kroot=$LAB_CACHE/kernel/$kver
  if [[ ! -e $kroot/.unpacked ]]; then
    mkdir -p "$LAB_CACHE/debs"
    if ! compgen -G "$LAB_CACHE/debs/${pkg}_*.deb" >/dev/null; then
      log "downloading $pkg into $LAB_CACHE/debs"
      # apt's download sandbox user must be able to write the target directory.
      # As root, apt warns that its sandbox user cannot write here; that is harmless.
      (cd "$LAB_CACHE/debs" && apt-get download -qq "$pkg" 2>&1) | grep -v 'unsandboxed' >&2 || :
      compgen -G "$LAB_CACHE/debs/${pkg}_*.deb" >/dev/null || die "apt-get download $pkg failed"
    fi
    local deb
    deb=$(compgen -G "$LAB_CACHE/debs/${pkg}_*.deb" | sort | tail -n 1)
    log "unpacking $(basename "$deb")"
    rm -rf "$kroot"
    mkdir -p "$kroot"
    dpkg -x "$deb" "$kroot"
    # Debian 12 ships modules under lib/; keep one place whichever layout the package uses.
    if [[ ! -d $kroot/lib/modules/$kver && -d $kroot/usr/lib/modules/$kver ]]; then
      mkdir -p "$kroot/lib"
      ln -s ../usr/lib/modules "$kroot/lib/modules"
    fi
    depmod -b "$kroot" "$kver"
    touch "$kroot/.unpacked"
  fi
  [[ -r $kroot/boot/vmlinuz-$kver ]] || die "no vmlinuz in $kroot"
  printf '%s\n' "$kver" >"$LAB_CACHE/kernel-version.tmp"
  mv "$LAB_CACHE/kernel-version.tmp" "$LAB_CACHE/kernel-version"
}

# The initramfs only has to reach the host's root; everything else runs from there. It is rebuilt
# when its init script, the kernel or the busybox binary changes.
prepare_initramfs() {
  local kver kroot
  kver=$(cached_kernel_version)
  kroot=$LAB_CACHE/kernel/$kver
  local out=$LAB_CACHE/initramfs-$kver.cpio.gz
  local stamp
  stamp=$(cat "$LAB_DIR/guest/initramfs-init" /bin/busybox "$kroot/boot/vmlinuz-$kver" | md5sum | cut -d' ' -f1)
  if [[ -r $out && -r $out.stamp && $(cat "$out.stamp") == "$stamp" ]]; then
    return 0
  fi
  log "building initramfs for $kver"
  local tmp
  tmp=$(mktemp -d "$LAB_CACHE/initramfs.XXXXXX")
  mkdir -p "$tmp"/{bin,dev,proc,sys,newroot,modules}
  cp /bin/busybox "$tmp/bin/busybox"
  cp "$LAB_DIR/guest/initramfs-init" "$tmp/init"
  chmod 0755 "$tmp/init" "$tmp/bin/busybox"
  # modprobe prints the insmod order (dependencies first); builtin modules print "builtin".
  local m line n=0 seen=" "
  : >"$tmp/modules/order"
  for m in "${INITRAMFS_MODULES[@]}"; do
    while read -r line; do
      [[ $line == insmod\ * ]] || continue
      local path=${line#insmod }
      path=${path%% *}
      [[ $seen == *" $path "* ]] && continue
      seen+="$path "
      n=$((n + 1))
      local name
      name=$(printf '%02d-%s' "$n" "$(basename "$path")")
      cp "$path" "$tmp/modules/$name"
      printf '%s\n' "$name" >>"$tmp/modules/order"
    done < <(modprobe -d "$kroot" -S "$kver" --show-depends "$m")
  done
  (cd "$tmp" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$out.tmp"
  mv "$out.tmp" "$out"
  printf '%s\n' "$stamp" >"$out.stamp"
  rm -rf "$tmp"
}

lab_prepare() {
  mkdir -p "$LAB_CACHE"
  prepare_packages
  prepare_kernel
  prepare_initramfs
  log "prepared: kernel $(cached_kernel_version), cache $LAB_CACHE"
}
