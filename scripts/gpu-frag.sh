#!/bin/bash
# The fragmentation and expandable-segments run on the GPU machine, from the repository root.
# Stage on a machine with Rust first (release bench binary and the test binaries, --features cuda):
#   scripts/gpu-stage --bench
# and send .gpu/ along. Then here:
#   bash scripts/gpu-frag.sh
# It runs (1) the virtual-memory and expandable-segment tests on the CUDA backend (the
# conformance test that grows and shrinks a reserved range through cuMem*, and the pool's own
# tests), then (2) `bench/run-gpu.sh fragmentation`: the GPT-2 and BERT traces recorded, CuPy and
# PyTorch (default and expandable_segments:True) replaying them with their raw calls counted, and
# gpumem's policies, with and without expandable segments, on the same traces. Logs, traces and
# table.md go to $OUT (or /tmp/gpumem-frag). Exits 1 when a test failed.
set -u
OUT=${OUT:-/tmp/gpumem-frag}
mkdir -p "$OUT"
export GPUMEM_REQUIRE_DEVICE=1 RUST_BACKTRACE=1
status=0
LOG="$OUT/vmm-tests.log"
: > "$LOG"
for t in .gpu/tests/conformance-* .gpu/tests/gpumem_core-*; do
    [ -e "$t" ] || continue
    echo "== $t" >> "$LOG"
    timeout 300 "./$t" --include-ignored vmm expandable segments >> "$LOG" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    echo "rc=$rc $(basename "$t")" | tee -a "$LOG"
done
grep -E "^test |^test result" "$LOG"
BENCH_DIR="$OUT" bash bench/run-gpu.sh fragmentation
exit "$status"
