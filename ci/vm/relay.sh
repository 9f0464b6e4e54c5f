# Sourced by ci/vm/run-vm.sh (and ci/vm/watchdog-test.sh, which checks it): init's first line,
# and the relay of the guest's serial console to stdout from that line on.

INIT_LINE='[[]softroce [0-9.]+[]] init started'   # ci/vm/init's first line (ERE: grep -E, sed -E)

# relay CONSOLE PID: print CONSOLE's lines from init's first line on, each as it comes, until
# PID ends. sed -u, not awk: Debian's default awk (mawk) reads a pipe in blocks, so the lines
# waited for the guest's end, and were lost when the VM was ended from outside (a two-VM
# test then took a peer that had booted for one that hung at boot).
relay() {
  tail -s 0.2 -n +1 -F --pid="$2" "$1" 2>/dev/null | sed -u -n -E "/$INIT_LINE/{:l;p;n;bl}"
}
