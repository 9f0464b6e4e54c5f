#!/usr/bin/env bash
# The VM's boot watchdog (run-vm.sh) on a guest that hangs before its init starts: init is a
# shell waiting on a console with no input (rdinit=/bin/sh). run-vm.sh must end it after
# SOFTROCE_BOOT_TIMEOUT, show the kernel's last console lines, boot it once more, and exit 125
# saying it hung twice, well before SOFTROCE_TIMEOUT. Then a normal guest, ended from outside
# while it runs: its log must show init's first line (the relay's lines come as they come).
#   ci/vm/watchdog-test.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
SETUP_VM=1 source ci/setup.sh || exit 1
set +e
ci/vm/build-initramfs.sh >&2 || exit 1
log=$(mktemp /tmp/vm-watchdog.XXXXXX); trap 'rm -f "$log"' EXIT
t=$SECONDS
SOFTROCE_BOOT_TIMEOUT=10 SOFTROCE_TIMEOUT=120 SOFTROCE_APPEND=rdinit=/bin/sh \
  ci/vm/run-vm.sh -- true > "$log" 2>&1
rc=$?
cat "$log"
fail=0
check() {  # check WHAT PATTERN: the log has a line matching PATTERN
  if grep -qE -- "$2" "$log"; then echo "watchdog-test: ok: $1"
  else echo "watchdog-test: FAILED: $1 (no line matching: $2)"; fail=1; fi
}
[ $rc -eq 125 ] && echo "watchdog-test: ok: exit status 125" ||
  { echo "watchdog-test: FAILED: exit status $rc, not 125"; fail=1; }
check "the hang named, with its timeout" "init did not start within 10 s"
check "the kernel's last console lines shown" '^  \| .*Run /bin/sh as init process'
check "booted once more" "booting it again \(2 of 2\)"
check "both boots hung, nothing ran" "the VM hung at boot 2 time\(s\); nothing ran"
[ "$(grep -c 'init did not start' "$log")" -eq 2 ] && echo "watchdog-test: ok: two boots" ||
  { echo "watchdog-test: FAILED: not two boots"; fail=1; }

# The relay itself (ci/vm/relay.sh), on a console written as a guest writes it: kernel lines,
# init's first line, one more, then nothing while the guest runs on. Both of init's lines must
# be relayed while the writer still runs (within 30 s: a loaded box may be slow to get there;
# the writer runs on for 60).
source ci/vm/relay.sh
cons=$(mktemp /tmp/vm-cons.XXXXXX) out=$(mktemp /tmp/vm-relay.XXXXXX)
sleep 60 & writer=$!
relay "$cons" $writer > "$out" &
rl=$!
for i in $(seq 1 40); do echo "[    1.$i] a kernel line" >> "$cons"; done
echo "[softroce 2.68] init started" >> "$cons"; echo "[softroce 3.01] modules loaded" >> "$cons"
for _ in $(seq 1 300); do [ "$(grep -c '^\[softroce' "$out")" = 2 ] && break; sleep 0.1; done
[ "$(grep -c '^\[softroce' "$out")" = 2 ] && ! grep -q 'kernel line' "$out" &&
  echo "watchdog-test: ok: the relay prints init's lines as they come, and none before them" ||
  { echo "watchdog-test: FAILED: the relay printed [$(tr '\n' '|' < "$out")] 30 s after init's lines"; fail=1; }
kill $writer; wait $rl 2>/dev/null; rm -f "$cons" "$out"

# The relay shows the guest's lines while it runs: a guest that is ended from outside (as
# ci/verbs-2vm-test.sh ends a peer) still leaves init's first line in its log, where the
# two-VM test looks for it to tell a VM that never started from one that was ended.
live=$(mktemp /tmp/vm-live.XXXXXX); trap 'rm -f "$log" "$live"' EXIT
SOFTROCE_TIMEOUT=300 setsid ci/vm/run-vm.sh -- sleep 250 > "$live" 2>&1 &
vm=$!
for _ in $(seq 1 300); do
  grep -qE "$INIT_LINE" "$live" || ! kill -0 $vm 2>/dev/null && break
  sleep 0.5
done
if grep -qE "$INIT_LINE" "$live" && kill -0 $vm 2>/dev/null; then
  echo "watchdog-test: ok: init's first line relayed while the guest runs"
else
  echo "watchdog-test: FAILED: init's first line not in the log of a running guest after 150 s"
  fail=1
fi
kill -TERM -- -$vm 2>/dev/null; sleep 2; kill -KILL -- -$vm 2>/dev/null; wait $vm 2>/dev/null
sed 's/^/  live | /' "$live"
echo "watchdog-test: $((SECONDS - t)) s: $([ $fail = 0 ] && echo PASSED || echo FAILED)"
exit $fail
