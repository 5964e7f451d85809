#!/bin/bash
# Runs gpumem's CUDA test binaries on the GPU machine, then compute-sanitizer's memcheck and
# racecheck over the CUDA-specific ones. From the repository root, after staging on a machine with
# Rust:
#   ../shared/tools/gpu-stage            # cargo test --workspace --no-run --features cuda
# and sending .gpu/ along. Logs go to $OUT (or /tmp/gpumem-tests).
#
# The HIP test binaries are removed first: the GPU machine has the HIP runtime but no AMD GPU, so
# their GPU tests (ignored elsewhere, run here by --include-ignored) could only fail.
# LineProfileHook's tests need debug info, which gpu-stage strips: they fail there for that reason
# alone (they pass in every build that keeps it; scripts/stage-tests.sh keeps it).
# Exits 1 when a test binary failed, alone or under a sanitizer (what the sanitizers report is in
# the summary printed last).
set -u
status=0
OUT=${OUT:-/tmp/gpumem-tests}
mkdir -p "$OUT"
export GPUMEM_REQUIRE_DEVICE=1 RUST_BACKTRACE=1
rm -f .gpu/tests/hip-* .gpu/tests/gpumem_hip-*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LOG="$OUT/tests.log"
: > "$LOG"
for t in .gpu/tests/*; do
    echo "== $t" >> "$LOG"
    timeout 300 "./$t" --include-ignored >> "$LOG" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    echo "rc=$rc $(basename "$t")" | tee -a "$LOG"
done
grep -E "^test result" "$LOG"
for tool in memcheck racecheck; do
    for t in .gpu/tests/cuda-* .gpu/tests/conformance-*; do
        echo "== $tool $t" >> "$LOG"
        timeout 300 compute-sanitizer --tool "$tool" "./$t" --include-ignored --test-threads=1 >> "$LOG" 2>&1
        rc=$?
        [ "$rc" -ne 0 ] && status=1
        echo "$tool rc=$rc $(basename "$t")"
    done
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Program hit" "$LOG" | sort | uniq -c
exit "$status"
