#!/bin/bash
# gpumem inside PyTorch and CuPy, on the GPU machine, from the repository root: GPT-2 training
# steps with PyTorch's allocator (a reference and a determinism control in separate processes,
# then with expandable_segments:True) and with gpumem's pool (its default growth policy,
# hold_peak_in_use, and segments with GPUMEM_EXPANDABLE_SEGMENTS=1), the losses compared bit for
# bit; then CuPy with gpumem as its allocator against CuPy's own pool. Fails
# (non-zero exit, "MISMATCH" on stderr) when any loss or CuPy result differs or a check fails.
#
# Needs a prebuilt library, made on a machine with Rust:
#   cargo build --release -p gpumem-capi --features cuda
#   mkdir -p .gpu/capi && cp target/release/libgpumem_capi.so .gpu/capi/ && strip .gpu/capi/libgpumem_capi.so
# (.gpu/ is ignored by git through .gitignore; send it along.) Another path:
# GPUMEM_CAPI_LIB=... bash scripts/gpu-capi.sh. Logs and JSON go to $OUT (or /tmp/gpumem-capi).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpumem-capi}
mkdir -p "$OUT"
LIB=$(realpath "${GPUMEM_CAPI_LIB:-.gpu/capi/libgpumem_capi.so}") || { echo "gpu-capi: no library at ${GPUMEM_CAPI_LIB:-.gpu/capi/libgpumem_capi.so}" >&2; exit 1; }
STEPS=${STEPS:-10}
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, cupy, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
    sha256sum "$LIB"
} 2>&1 | tee "$OUT/environment.txt"

status=0
run() { # name, command...
    local name=$1; shift
    echo "== $name"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 4 "$OUT/$name.log"
    if [ $rc -ne 0 ]; then
        echo "gpu-capi: $name FAILED (exit $rc); see $OUT/$name.log" >&2
        grep -E "MISMATCH|Error|error" "$OUT/$name.log" | tail -n 5 >&2
        status=1
    fi
    return $rc
}

T=scripts/capi/torch_train.py
run torch-reference python3 $T --allocator torch --steps "$STEPS" --label "PyTorch allocator" --out "$OUT/torch-reference.json"
run torch-control python3 $T --allocator torch --steps "$STEPS" --label "PyTorch allocator (control)" --out "$OUT/torch-control.json"
run gpumem-default python3 $T --allocator gpumem --lib "$LIB" --steps "$STEPS" --label "gpumem (the C ABI's default: segments, expandable segments)" --out "$OUT/gpumem-default.json"
run gpumem-hold-peak python3 $T --allocator gpumem --lib "$LIB" --steps "$STEPS" --growth-policy hold_peak_in_use --label "gpumem (hold_peak_in_use)" --out "$OUT/gpumem-hold-peak.json"
run gpumem-segments-expandable env GPUMEM_EXPANDABLE_SEGMENTS=1 python3 $T --allocator gpumem --lib "$LIB" --steps "$STEPS" --growth-policy segments --label "gpumem (segments, expandable segments)" --out "$OUT/gpumem-segments-expandable.json"
run torch-expandable env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $T --allocator torch --steps "$STEPS" --label "PyTorch allocator (expandable_segments:True)" --out "$OUT/torch-expandable.json"
RUNS=("$OUT/torch-reference.json" "$OUT/torch-control.json" "$OUT/gpumem-default.json" "$OUT/gpumem-hold-peak.json" "$OUT/gpumem-segments-expandable.json" "$OUT/torch-expandable.json")
if ls "${RUNS[@]}" > /dev/null 2>&1; then
    python3 scripts/capi/compare_training.py "$OUT/training-summary.json" "${RUNS[@]}" 2>&1 | tee "$OUT/training-summary.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "gpu-capi: MISMATCH: a training run produced no result" >&2
    status=1
fi

run cupy python3 scripts/capi/cupy_check.py --lib "$LIB" --out "$OUT/cupy.json"
echo "cupy checks: $(grep -c '^ok  ' "$OUT/cupy.log") passed, $(grep -c '^FAIL' "$OUT/cupy.log") failed"

echo "gpu-capi: exit $status (logs and JSON in $OUT)"
exit $status
