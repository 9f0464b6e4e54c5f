# Sourced: this host's shared libraries, copied where another machine lacks them (the Soft-RoCE
# VM's shares, the GPU host's pack). Used by ci/verbs-vm-test.sh, verbs-2vm-test.sh,
# compare-ref-vm.sh, gpu-host.sh and ci/vm/ucx-share.sh.

# host_lib SONAME: the x86-64 file of SONAME, from ldconfig ("" where none). No early exit in
# awk: ldconfig would die of SIGPIPE, and pipefail with it.
host_lib() {
  ldconfig -p | awk -v l="$1" '$1 == l && /x86-64/ && !p {p = $NF} END {print p}'
}

# host_libs_into DIR SONAME...: copy each SONAME's file (links followed) into DIR. Returns 1,
# naming them on stderr, where some are not installed here (the others are copied).
host_libs_into() {
  local dir=$1 l p miss=(); shift
  for l in "$@"; do
    p=$(host_lib "$l")
    if [ -n "$p" ]; then cp -L "$p" "$dir/"; else miss+=("$l"); fi
  done
  [ ${#miss[@]} = 0 ] || { echo "host_libs_into: not installed here: ${miss[*]}" >&2; return 1; }
}
