#!/bin/bash
# Runs gpumem's CUDA test binaries on the GPU machine, then compute-sanitizer's memcheck and
# racecheck over the CUDA-specific ones. From the repository root, after staging on a machine with
# Rust:
#   scripts/gpu-stage            # cargo test --workspace --no-run --features cuda
# and sending .gpu/ along. Logs go to $OUT (or /tmp/gpumem-tests).
#
# The HIP test binaries are removed first: the GPU machine has the HIP runtime but no AMD GPU, so
# their GPU tests (ignored elsewhere, run here by --include-ignored) could only fail. The HIP
# backend's conformance binary shares its name with the others (conformance-<hash>); it is known
# by the path of its test file, which its panic messages carry.
# LineProfileHook's and the Recorder's call-site tests need debug info, which gpu-stage strips:
# they fail there for that reason alone (scripts/stage-tests.sh keeps it). gpu-stage also stages
# the examples beside the tests; they take no test arguments, so they run with none.
# Exits 1 when a test binary failed, alone or under a sanitizer (what the sanitizers report is in
# the summary printed last).
set -u
status=0
OUT=${OUT:-/tmp/gpumem-tests}
mkdir -p "$OUT"
export GPUMEM_REQUIRE_DEVICE=1 RUST_BACKTRACE=1
rm -f .gpu/tests/hip-* .gpu/tests/gpumem_hip-*
for t in .gpu/tests/conformance-*; do
    [ -f "$t" ] && grep -q "backend-hip/tests/conformance.rs" "$t" && rm -f "$t"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LOG="$OUT/tests.log"
: > "$LOG"
for t in .gpu/tests/*; do
    echo "== $t" >> "$LOG"
    # Test harnesses are named <target>-<16 hex digits>, the examples NN-<name>; the workspace's
    # other programs (the gpumem-trace tool) are neither and are not run here.
    name=$(basename "$t")
    if [[ $name =~ -[0-9a-f]{16}$ ]]; then
        args=(--include-ignored)
    elif [[ $name =~ ^[0-9][0-9]- ]]; then
        args=()
    else
        echo "skipped $name (not a test or an example)" | tee -a "$LOG"
        continue
    fi
    timeout 300 "./$t" "${args[@]}" >> "$LOG" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    echo "rc=$rc $(basename "$t")" | tee -a "$LOG"
done
grep -E "^test result" "$LOG"
for tool in memcheck racecheck; do
    for t in .gpu/tests/cuda-* .gpu/tests/conformance-*; do
        echo "== $tool $t" >> "$LOG"
        timeout 300 compute-sanitizer --tool "$tool" "./$t" --include-ignored --test-threads=1 > "$OUT/sanitizer.log" 2>&1
        rc=$?
        cat "$OUT/sanitizer.log" >> "$LOG"
        # The host backend's conformance suite (also named conformance-*) makes no CUDA call:
        # there is nothing for the sanitizer to check, and it says so with an error status.
        if [ "$rc" -ne 0 ] && grep -q "terminated before first instrumented API call" "$OUT/sanitizer.log" \
            && grep -q "^test result: ok" "$OUT/sanitizer.log"; then
            echo "$tool skipped (no CUDA call) $(basename "$t")"
            continue
        fi
        [ "$rc" -ne 0 ] && status=1
        echo "$tool rc=$rc $(basename "$t")"
    done
done
rm -f "$OUT/sanitizer.log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Program hit" "$LOG" | sort | uniq -c
exit "$status"
