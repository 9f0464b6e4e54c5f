#!/bin/bash
# The project's Soft-RoCE VM, part 1 (adapted from the team's proven recipe).
# Build a self-contained initramfs (busybox + Debian 12 kernel modules for Soft-RoCE
# + rdma-core/perftest userspace) and put the matching Debian kernel next to it.
#
# Output (in $OUTDIR, default ci/.vm/out; downloads cached in $WORK, default ci/.vm/work):
#   vmlinuz       Debian 12 kernel (linux-image-6.1.0-*-amd64)
#   vmlinux       same kernel, decompressed ELF (PVH boot, faster under TCG)
#   initrd.cpio   uncompressed newc cpio (uncompressed boots faster under TCG)
#
# Needs on the host (Debian 12): apt-get, dpkg-deb, cpio, busybox-static, kmod (depmod), xz-utils,
# binutils (readelf), ldd, ldconfig; ci/setup.sh with SETUP_VM=1 installs them.
# Skips all work when $OUTDIR is up to date with this script and ./init (FORCE=1 rebuilds).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VMDIR=$(cd "$HERE/.." && pwd)/.vm
WORK=${WORK:-$VMDIR/work}
OUTDIR=${OUTDIR:-$VMDIR/out}
DEBS=$WORK/debs
X=$WORK/extract
ROOT=$WORK/root

mkdir -p "$DEBS" "$OUTDIR"
STAMP=$(cat "$HERE/build-initramfs.sh" "$HERE/init" | sha256sum | cut -c1-16)
if [ -z "${FORCE:-}" ] && [ -f "$OUTDIR/initrd.cpio" ] && [ -f "$OUTDIR/vmlinuz" ] &&
   [ "$(cat "$OUTDIR/stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "initramfs up to date in $OUTDIR" >&2
  exit 0
fi
for t in apt-get dpkg-deb cpio busybox depmod xz readelf ldd ldconfig; do
  command -v "$t" >/dev/null || [ -x "/sbin/$t" ] || [ -x "/bin/$t" ] ||
    { echo "build-initramfs: $t missing: run with ci/setup.sh (SETUP_VM=1) first" >&2; exit 1; }
done

# ---------------------------------------------------------------- 1. packages
# apt-get download needs package lists; a fresh machine may have none.
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !k {k = $2} END {print k}'; }
KPKG=${KPKG:-$(kernel_pkg)}
if [ -z "$KPKG" ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  KPKG=$(kernel_pkg)
fi
[ -n "$KPKG" ] || { echo "build-initramfs: no linux-image package known to apt" >&2; exit 1; }
PKGS="$KPKG rdma-core ibverbs-providers libibverbs1 librdmacm1 ibverbs-utils perftest
      iproute2 libnl-3-200 libnl-route-3-200 libibumad3 libpci3"
( cd "$DEBS"
  for p in $PKGS; do
    ls ${p}_*.deb >/dev/null 2>&1 && continue
    # stale package lists (the mirror moved on) fail the download: refresh once and retry
    apt-get -o APT::Sandbox::User=root download "$p" >/dev/null 2>&1 ||
      { SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo; $SUDO apt-get update -qq &&
        apt-get -o APT::Sandbox::User=root download "$p" >/dev/null; } ||
      { echo "build-initramfs: apt-get download $p failed" >&2; exit 1; }
  done
  # a cached kernel of another ABI would put two trees under lib/modules
  for d in linux-image-*.deb; do
    [ -e "$d" ] || continue
    case $d in "${KPKG}"_*) ;; *) rm -f "$d" ;; esac
  done )
rm -rf "$X"; mkdir -p "$X"
for d in "$DEBS"/*.deb; do dpkg-deb -x "$d" "$X"; done
KV=$(ls "$X/lib/modules")
echo "kernel: $KV"
cp "$X/boot/vmlinuz-$KV" "$OUTDIR/vmlinuz"
# Uncompressed ELF vmlinux for qemu's PVH boot (-kernel vmlinux): skips SeaBIOS' real-mode
# setup and the XZ decompression, which together cost ~3 s under TCG.
off=$(grep -m1 -abo $'\xfd7zXZ\x00' "$OUTDIR/vmlinuz" | head -1 | cut -d: -f1)
tail -c +$((off + 1)) "$OUTDIR/vmlinuz" | xz -dc > "$OUTDIR/vmlinux" 2>/dev/null || true
readelf -h "$OUTDIR/vmlinux" >/dev/null 2>&1 || rm -f "$OUTDIR/vmlinux"
/sbin/depmod -b "$X" "$KV"

# ---------------------------------------------------------------- 2. skeleton
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt/host,mnt/ctl,root,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64}
ln -s usr/lib "$ROOT/lib"
ln -s usr/lib64 "$ROOT/lib64"
cp /bin/busybox "$ROOT/bin/busybox"
for a in $(/bin/busybox --list); do
  [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"
done

# ---------------------------------------------------------------- 3. kernel modules
MODS="ib_core ib_uverbs udp_tunnel ip6_udp_tunnel crc32_generic rdma_rxe veth 8021q
      configfs iw_cm ib_cm rdma_cm rdma_ucm ib_umad
      virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
      netfs fscache 9pnet 9pnet_virtio 9p
      virtio_net"
MD=$X/lib/modules/$KV
ORDER=()
add_mod() {   # resolve deps (modules.dep lists deps; load them first)
  local name=$1 line path deps d
  line=$(grep -E "/${name//_/[_-]}\.ko(\.xz|\.zst)?:" "$MD/modules.dep" || true)
  [ -n "$line" ] || { echo "module $name not found (builtin?)" >&2; return 0; }
  path=${line%%:*}; deps=${line#*:}
  for p in "${ORDER[@]:-}"; do [ "$p" = "$path" ] && return 0; done
  for d in $(echo $deps | tr ' ' '\n' | tac); do
    add_mod "$(basename "${d%%.ko*}")"
  done
  for p in "${ORDER[@]:-}"; do [ "$p" = "$path" ] && return 0; done
  ORDER+=("$path")
}
for m in $MODS; do add_mod "$m"; done
for p in "${ORDER[@]}"; do
  mkdir -p "$ROOT/lib/modules/$KV/$(dirname "$p")"
  cp "$MD/$p" "$ROOT/lib/modules/$KV/$p"
  echo "/lib/modules/$KV/$p"
done > "$ROOT/etc/modules.order"
cp "$MD"/modules.order "$MD"/modules.builtin "$MD"/modules.builtin.modinfo "$ROOT/lib/modules/$KV/" 2>/dev/null || true
/sbin/depmod -b "$ROOT" "$KV"

# ---------------------------------------------------------------- 4. userspace
BINS="$X/bin/ip $X/usr/bin/rdma
      $X/usr/bin/ibv_devices $X/usr/bin/ibv_devinfo $X/usr/bin/ibv_rc_pingpong $X/usr/bin/ibv_ud_pingpong
      $X/usr/bin/ib_write_bw $X/usr/bin/ib_write_lat $X/usr/bin/ib_send_bw $X/usr/bin/ib_send_lat
      $X/usr/bin/ib_read_bw $X/usr/bin/ib_read_lat $X/usr/bin/ib_atomic_bw $X/usr/bin/ib_atomic_lat"
PROVIDERS="$X/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
# extra host libs commonly needed by test binaries (Rust std needs libgcc_s)
EXTRA_LIBS="/lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libm.so.6
            /lib/x86_64-linux-gnu/libpthread.so.0 /lib/x86_64-linux-gnu/libdl.so.2
            /lib/x86_64-linux-gnu/librt.so.1 /lib/x86_64-linux-gnu/libutil.so.1
            /lib/x86_64-linux-gnu/libresolv.so.2 /lib/x86_64-linux-gnu/libz.so.1
            $X/usr/lib/x86_64-linux-gnu/libibumad.so.3"
strip_x() { local p=$1; p=${p#$X}; p=${p#/usr}; p=${p#/lib/}; echo "/usr/lib/$p"; }
copy_lib() {  # copy a library (following symlinks) to /usr/lib/..., keep soname name
  local src=$1 dst
  dst=$ROOT$(strip_x "$src")
  mkdir -p "$(dirname "$dst")"
  [ -e "$dst" ] || cp -L "$src" "$dst"
}
export LD_LIBRARY_PATH=$X/lib/x86_64-linux-gnu:$X/usr/lib/x86_64-linux-gnu
for b in $BINS $PROVIDERS $EXTRA_LIBS; do
  case $b in
    *.so*) copy_lib "$b" ;;
    *) cp "$b" "$ROOT/usr/bin/" ;;
  esac
  # a library the building machine lacks would be missing in the VM: say which, and stop
  if ldd "$b" | grep -q "not found"; then
    echo "build-initramfs: $b needs $(ldd "$b" | awk '/not found/{print $1}' | tr '\n' ' ')on this machine (SETUP_VM=1 ci/setup.sh installs them)" >&2
    exit 1
  fi
  ldd "$b" | awk '/=> \//{print $3}' | while read -r l; do copy_lib "$l"; done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$ROOT/usr/lib64/ld-linux-x86-64.so.2"
ln -sf /usr/lib64/ld-linux-x86-64.so.2 "$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
mkdir -p "$ROOT/etc/libibverbs.d"
cp "$X/etc/libibverbs.d/rxe.driver" "$ROOT/etc/libibverbs.d/"
printf '/usr/lib/x86_64-linux-gnu\n/usr/local/lib\n' > "$ROOT/etc/ld.so.conf"
/sbin/ldconfig -r "$ROOT" 2>/dev/null || ldconfig -r "$ROOT"
echo 'root:x:0:0:root:/root:/bin/sh' > "$ROOT/etc/passwd"
echo 'root:x:0:' > "$ROOT/etc/group"
printf '127.0.0.1 localhost\n10.99.0.1 node0\n10.99.0.2 node1\n10.99.1.1 vm0\n10.99.1.2 vm1\n' > "$ROOT/etc/hosts"
echo "$KV" > "$ROOT/etc/kernel-version"

install -m 0755 "$HERE/init" "$ROOT/init"

# ---------------------------------------------------------------- 5. archive
( cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --owner=0:0 --quiet ) > "$OUTDIR/initrd.cpio"
echo "$STAMP" > "$OUTDIR/stamp"
ls -la "$OUTDIR" >&2
