#!/bin/bash
# Runs gpumem's HIP backend on an NVIDIA GPU through the HIP-on-CUDA runtime in
# scripts/hip-on-cuda/ (a libamdhip64.so on the CUDA runtime, for testing only), then
# compute-sanitizer's memcheck over the same binaries. From the repository root on the GPU
# machine (CUDA toolkit with nvcc; no Rust), after staging on a machine with Rust and HIP's
# headers (Debian: libamdhip64-dev):
#   export HIP_PATH=/usr
#   STAGE_DIR=.gpu/hip-tests bash scripts/stage-tests.sh -p gpumem-hip
#   STAGE_DIR=.gpu/auto-tests bash scripts/stage-tests.sh -p gpumem-auto --features cuda,hip
# and sending .gpu/ along. Logs go to $OUT (or /tmp/gpumem-hip-tests).
#
# 1. Builds the shim: nvcc -shared -Xcompiler -fPIC ... -lcuda (its virtual-memory calls are the
#    driver API's) -> $SHIM/lib/libamdhip64.so, found first
#    through HIP_PATH=$SHIM (gpumem-hip looks under $HIP_PATH/lib before the search path) and
#    LD_LIBRARY_PATH.
# 2. Runs gpumem-hip's tests (its conformance suite included) with --include-ignored and
#    GPUMEM_REQUIRE_DEVICE=1.
# 3. Runs gpumem-auto's tests (one binary built with cuda and hip) three times: with
#    GPUMEM_BACKEND unset (CUDA must be chosen), =cuda and =hip (through the shim).
# 4. compute-sanitizer --tool memcheck over gpumem-hip's binaries and the auto conformance suite
#    with GPUMEM_BACKEND=hip.
# Exits 1 when the shim does not build or a test binary fails, alone or under memcheck.
set -u
status=0
OUT=${OUT:-/tmp/gpumem-hip-tests}
mkdir -p "$OUT"
HIP_DIR=.gpu/hip-tests
AUTO_DIR=.gpu/auto-tests
SHIM=$(mktemp -d)/hip-on-cuda
mkdir -p "$SHIM/lib"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version | tail -1
if ! nvcc -shared -Xcompiler -fPIC -O2 -o "$SHIM/lib/libamdhip64.so" scripts/hip-on-cuda/hip_on_cuda.c -lcuda \
    > "$OUT/nvcc.log" 2>&1; then
    cat "$OUT/nvcc.log"
    echo "the HIP-on-CUDA shim did not build"
    exit 1
fi
nm -D --defined-only "$SHIM/lib/libamdhip64.so" | grep -c ' T hip' | sed 's/^/shim entry points: /'
export HIP_PATH="$SHIM" LD_LIBRARY_PATH="$SHIM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUMEM_REQUIRE_DEVICE=1 RUST_BACKTRACE=1

LOG="$OUT/tests.log"
: > "$LOG"
# run LABEL BINARY [ENV=VALUE...]: one test binary with --include-ignored.
run() {
    local label=$1 t=$2
    shift 2
    echo "== $label $t" >> "$LOG"
    env "$@" timeout 300 "./$t" --include-ignored >> "$LOG" 2>&1
    local rc=$?
    [ "$rc" -ne 0 ] && status=1
    echo "rc=$rc $label $(basename "$t")" | tee -a "$LOG"
}
for t in "$HIP_DIR"/*; do
    run hip "$t"
done
for backend in "" cuda hip; do
    for t in "$AUTO_DIR"/*; do
        run "auto[GPUMEM_BACKEND=${backend:-unset}]" "$t" "GPUMEM_BACKEND=$backend"
    done
done
grep -E "^== |^test result|GPUMEM_BACKEND=" "$LOG"

MLOG="$OUT/memcheck.log"
: > "$MLOG"
# memcheck LABEL BINARY [ENV=VALUE...]
memcheck() {
    local label=$1 t=$2
    shift 2
    echo "== memcheck $label $t" >> "$MLOG"
    env "$@" timeout 300 compute-sanitizer --tool memcheck "./$t" --include-ignored \
        --test-threads=1 >> "$MLOG" 2>&1
    local rc=$?
    [ "$rc" -ne 0 ] && status=1
    echo "memcheck rc=$rc $label $(basename "$t")"
}
for t in "$HIP_DIR"/*; do
    memcheck hip "$t"
done
for t in "$AUTO_DIR"/conformance-*; do
    memcheck "auto[GPUMEM_BACKEND=hip]" "$t" GPUMEM_BACKEND=hip
done
grep -E "^== |ERROR SUMMARY|^test result" "$MLOG"
exit "$status"
