#!/usr/bin/env bash
# Resolves the frames a crash report printed (transport-proxy/tests/common/crash.rs:
# "CRASH: frame N 0xADDR /path/object+0xOFFSET ...") to functions: with addr2line where the
# object has line tables, else from its symbol table (nm). Objects whose path does not exist
# here are left as they are. Usage: ci/crash-frames.sh LOG [EXE]; EXE, when given, stands in
# for every object path ending in the same file name (an unstripped copy of a test binary
# that ran stripped elsewhere: offsets are the same).
set -uo pipefail
log=$1 exe=${2:-}
sym_of() { # object offset -> function via nm: the last symbol at or below offset
  local obj=$1 off=$2
  nm -C --defined-only "$obj" 2>/dev/null | awk -v want="$((off))" '
    $2 ~ /^[tTwW]$/ { a = strtonum("0x" $1); if (a <= want && a >= best) { best = a; name = $0 } }
    END { if (name != "") { sub(/^[0-9a-f]+ [A-Za-z] /, "", name); printf "%s+0x%x", name, want - best } }'
}
grep -E '^CRASH: ' "$log" | while IFS= read -r line; do
  ref=$(sed -nE 's/.*0x[0-9a-f]+ ([^ ]+\+0x[0-9a-f]+).*/\1/p' <<< "$line")
  fn=""
  if [ -n "$ref" ]; then
    obj=${ref%+*} off=${ref##*+}
    [ -n "$exe" ] && [ "$(basename "$obj")" = "$(basename "$exe")" ] && obj=$exe
    if [ -f "$obj" ]; then
      if command -v addr2line > /dev/null; then
        fn=$(addr2line -f -C -i -e "$obj" "$off" 2>/dev/null | paste -sd' ' -)
      fi
      case $fn in ""|"??"*) fn=$(sym_of "$obj" "$off") ;; esac
    fi
  fi
  echo "$line${fn:+  => $fn}"
done
