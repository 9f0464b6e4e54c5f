#!/usr/bin/env bash
# run-vm.sh's exit status, against stand-in qemus (no VM, no kernel: seconds). qemu exits 1
# both for a guest that finished with 0 (isa-debug-exit: 2*rc+1) and for a qemu that failed to
# start, so run-vm.sh must take the guest's status only from what the guest wrote: ctl/rc over
# 9p for a command, init's SOFTROCE_EXIT line for the built-in suite. Anything else is 125.
#   ci/vm/exit-status-test.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d /tmp/vm-exit.XXXXXX); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/out"
touch "$T/out/vmlinuz" "$T/out/vmlinux" "$T/out/initrd.cpio"   # never read: qemu is a stand-in
# The stand-in qemu: FAKE_QEMU says what it does. It finds the console file and the ctl share in
# its arguments as the real one would.
cat > "$T/bin/qemu-system-x86_64" <<'EOF'
#!/bin/bash
console= ctl=
for a in "$@"; do
  case $a in
    file:*) console=${a#file:} ;;
    local,path=*mount_tag=ctl*) ctl=${a#local,path=}; ctl=${ctl%%,*} ;;
  esac
done
line() { echo "[softroce 1.00] $*" >> "$console"; }
case $FAKE_QEMU in
  no-start) echo "qemu-system-x86_64: failed to initialize kvm: No such file or directory" >&2 ;;
  no-rc)    line "init started"; line "running /mnt/ctl/cmd.sh" ;;   # the share did not take rc
  rc-0)     line "init started"; echo 0 > "$ctl/rc"; line "SOFTROCE_EXIT=0" ;;
  rc-3)     line "init started"; echo 3 > "$ctl/rc"; line "SOFTROCE_EXIT=3"; exit 7 ;;
  suite-0)  line "init started"; line "SOFTROCE_EXIT=0" ;;
  suite-4)  line "init started"; line "SOFTROCE_EXIT=4"; exit 9 ;;
  suite-cut) line "init started" ;;                                   # died before the end
esac
exit 1
EOF
chmod +x "$T/bin/qemu-system-x86_64"
fail=0
expect() {  # expect WANT FAKE [-- CMD]: run-vm.sh with the stand-in FAKE exits WANT
  local want=$1 fake=$2; shift 2
  local rc
  FAKE_QEMU=$fake PATH="$T/bin:$PATH" SOFTROCE_OUT="$T/out" SOFTROCE_TMPDIR="$T/tmp" \
    SOFTROCE_BOOT_TIMEOUT=10 SOFTROCE_BOOT_TRIES=1 ci/vm/run-vm.sh "$@" > "$T/log" 2>&1
  rc=$?
  if [ "$rc" = "$want" ]; then echo "exit-status-test: ok: $fake ${*:+(command)} gives $rc"
  else
    echo "exit-status-test: FAILED: $fake ${*:+(command)} gave $rc, not $want:"; sed 's/^/  | /' "$T/log"
    fail=1
  fi
}
expect 125 no-start -- true
expect 125 no-rc -- true
expect 0 rc-0 -- true
expect 3 rc-3 -- true
expect 125 no-start
expect 125 suite-cut
expect 0 suite-0
expect 4 suite-4
[ $fail = 0 ] && echo "exit-status-test: passed" || echo "exit-status-test: FAILED"
exit $fail
