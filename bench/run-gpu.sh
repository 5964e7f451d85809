#!/bin/bash
# Runs gpumem's GPU benchmark with its anchors, on the GPU machine, from the repository root.
# The benchmark binary is staged first, on a machine with Rust, by
#   ../shared/tools/gpu-stage --bench --no-tests
# which leaves it in .gpu/benches/. Results (table.md, anchors.txt, traces, logs) go to
# $BENCH_DIR, else $OUT.
set -u
DIR=${BENCH_DIR:-${OUT:-/tmp/gpumem-bench}}
mkdir -p "$DIR"
BIN=$(ls .gpu/benches/gpu-* | head -n 1)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
"$BIN" --write-trace "$DIR/random.trace"
PYTHONUNBUFFERED=1 python3 bench/record_training_trace.py "$DIR/training.trace" 2>&1 | tail -n 3
PYTHONUNBUFFERED=1 python3 bench/anchors.py "$DIR" 2>&1 | tee "$DIR/anchors.log"
GPUMEM_BENCH_DIR="$DIR" "$BIN" 2>&1 | tee "$DIR/gpu-bench.log"
