#!/bin/bash
# Runs the cudarc interop on the GPU machine: example 07 (a kernel compiled with NVRTC, launched on
# gpumem memory) and the interop tests. From the repository root, after staging on a machine with
# Rust:
#   scripts/gpu-stage --features cuda,cudarc-cuda-12000,nvrtc --example 07-cudarc-interop
# and sending .gpu/ along. Logs go to $OUT (or /tmp/gpumem-interop). Exits 1 when either fails.
set -u
OUT=${OUT:-/tmp/gpumem-interop}
mkdir -p "$OUT"
export GPUMEM_REQUIRE_DEVICE=1 RUST_BACKTRACE=1
# cudarc opens libnvrtc.so (or .so.12 and older): the toolkit's folder goes on the search path, so
# CUDA 13's unversioned libnvrtc.so is found.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$dir/libnvrtc.so" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
echo "== example 07-cudarc-interop" | tee "$OUT/example.log"
timeout 120 ./.gpu/bins/07-cudarc-interop 2>&1 | tee -a "$OUT/example.log"
rc=${PIPESTATUS[0]}
echo "rc=$rc" | tee -a "$OUT/example.log"
[ "$rc" -ne 0 ] && status=1
for t in .gpu/tests/interop-*; do
    [ -x "$t" ] || continue
    echo "== $t" | tee -a "$OUT/tests.log"
    timeout 300 "./$t" --include-ignored >>"$OUT/tests.log" 2>&1
    rc=$?
    echo "rc=$rc" | tee -a "$OUT/tests.log"
    [ "$rc" -ne 0 ] && status=1
done
grep -E "^test result|FAILED|panicked" "$OUT/tests.log"
exit $status
