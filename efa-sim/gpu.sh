#!/usr/bin/env bash
# GPU memory on the simulated device where there is no GPU; run under ci/efa-sim.sh:
#
#   ci/efa-sim.sh efa-sim/gpu.sh
#
# efa-sim-gpu (tests/gpu.c) twice: without CUDA (ibv_reg_dmabuf_mr refused with EOPNOTSUPP,
# host memory as before), then against the stand-in libcuda.so.1 of tests/fakecuda.c, whose
# "device memory" the process cannot touch and whose stream copies happen only when the
# stream is synchronised: registration by address and as a dmabuf, WRITE and READ through
# the simulator's CUDA copies, every byte checked after its completion, and the refusals.
# The GPU host runs the same program against the real driver (ci/gpu-efa-sim.sh run).
set -euo pipefail
bin=$(command -v efa-sim-gpu) || { echo "gpu.sh: no efa-sim-gpu (run me under ci/efa-sim.sh)" >&2; exit 2; }
fake=$(dirname "$bin")/fakecuda
[ -f "$fake/libcuda.so.1" ] || { echo "gpu.sh: no $fake/libcuda.so.1" >&2; exit 2; }
echo "== without CUDA"
efa-sim-gpu
echo "== with the stand-in libcuda.so.1 (tests/fakecuda.c)"
LD_LIBRARY_PATH=$fake:$LD_LIBRARY_PATH efa-sim-gpu --require-cuda
