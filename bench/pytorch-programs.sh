#!/bin/bash
# The memory table of BENCHMARKS.md on the GPU machine: each program of bench/pytorch_programs.py
# under PyTorch's allocator (default, then expandable_segments:True) and gpumem's through its C ABI
# (the ABI's default; the same with gpumem_step after each iteration; and that with fixed blocks;
# and both planned with no gpumem_step, gpumem_plan_automatically; and the default with stitching,
# GPUMEM_STITCH=1), each in its own process, in one run.
#
# Needs the library built with CUDA on a machine with Rust:
#   cargo build --release -p gpumem-capi --features cuda
# and GPUMEM_CAPI_LIB pointing at it (default target/release/libgpumem_capi.so).
# PROGRAMS="gen cnn" limits the programs; RUNS="torch torch-expandable default auto auto-fixed"
# limits the runs of each (default all: torch torch-expandable default step step-fixed auto
# auto-fixed stitch auto-stitch). Results go to $OUT (default /tmp/gpumem-programs): results.jsonl (one line per
# run), log.txt and table.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpumem-programs}
mkdir -p "$OUT"
LIB=$(realpath "${GPUMEM_CAPI_LIB:-target/release/libgpumem_capi.so}") || exit 1
P=bench/pytorch_programs.py
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# One run of $program in its own process, under PyTorch's allocator or gpumem's; the arguments
# add the label and the program's flags, and variables set before the call reach the process.
torch_run() { timeout 150 python3 $P "$program" --allocator torch --out "$OUT/results.jsonl" "$@"; }
gpumem_run() { timeout 150 python3 $P "$program" --allocator gpumem --lib "$LIB" --out "$OUT/results.jsonl" "$@"; }
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    sha256sum "$LIB"
    for program in ${PROGRAMS:-gen cnn vit bert}; do
        for run in ${RUNS:-torch torch-expandable default step step-fixed auto auto-fixed stitch auto-stitch}; do
            case $run in
            torch) torch_run --label "PyTorch default" ;;
            torch-expandable) PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torch_run --label "PyTorch expandable" ;;
            default) gpumem_run --label "gpumem C ABI default" ;;
            step) gpumem_run --step --label "gpumem default, planned (gpumem_step)" ;;
            step-fixed) GPUMEM_EXPANDABLE_SEGMENTS=0 gpumem_run --step --label "gpumem fixed blocks, planned" ;;
            auto) gpumem_run --plan-automatically --label "gpumem default, planned automatically" ;;
            auto-fixed) GPUMEM_EXPANDABLE_SEGMENTS=0 gpumem_run --plan-automatically \
                --label "gpumem fixed blocks, planned automatically" ;;
            stitch) GPUMEM_STITCH=1 gpumem_run --label "gpumem default, stitching" ;;
            auto-stitch) GPUMEM_STITCH=1 gpumem_run --plan-automatically \
                --label "gpumem stitching, planned automatically" ;;
            *) echo "unknown run: $run" ;;
            esac
        done
    done
    python3 $P --table "$OUT/results.jsonl" | tee "$OUT/table.md"
} 2>&1 | grep -v "Warning\|warn(" | tee "$OUT/log.txt"
