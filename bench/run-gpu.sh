#!/bin/bash
# Runs gpumem's GPU benchmark with its anchors, on the GPU machine, from the repository root.
# The benchmark binary is staged first, on a machine with Rust, by
#   scripts/gpu-stage --bench --no-tests
# which leaves it in .gpu/benches/. Results (table.md, anchors.txt, traces, logs) go to
# $BENCH_DIR, else $OUT.
#
#   bash bench/run-gpu.sh                  everything
#   bash bench/run-gpu.sh fragmentation    only the fragmentation rows: the traces recorded, then
#                                          CuPy, PyTorch (default and expandable segments) and
#                                          gpumem's policies replaying them
set -u
ONLY=${1:-}
DIR=${BENCH_DIR:-${OUT:-/tmp/gpumem-bench}}
mkdir -p "$DIR"
BIN=$(ls .gpu/benches/gpu-* | head -n 1)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
"$BIN" --write-trace "$DIR/random.trace"
"$BIN" --write-seeds "$DIR"
PYTHONUNBUFFERED=1 python3 bench/record_training_trace.py gpt2 "$DIR/training.trace" 2>&1 | tail -n 3
PYTHONUNBUFFERED=1 python3 bench/record_training_trace.py bert "$DIR/bert.trace" 2>&1 | tail -n 3
# The pool's own figures for each trace without the device (ratio and raw calls depend only on
# the pool's rules and the trace; the device run below must show the same).
for t in training bert; do
    [ -f "$DIR/$t.trace" ] && { echo "== host replay of $t.trace"; "$BIN" --replay-host "$DIR/$t.trace"; }
done 2>&1 | tee "$DIR/host-replay.log"
"$BIN" --replay-seeds 2>&1 | tee -a "$DIR/host-replay.log"
PYTHONUNBUFFERED=1 python3 bench/anchors.py "$DIR" ${ONLY:+"$ONLY"} 2>&1 | tee "$DIR/anchors.log"
if [ "$ONLY" = fragmentation ]; then
    GPUMEM_BENCH_ONLY=fragmentation GPUMEM_BENCH_DIR="$DIR" "$BIN" 2>&1 | tee "$DIR/gpu-bench.log"
else
    GPUMEM_BENCH_DIR="$DIR" "$BIN" 2>&1 | tee "$DIR/gpu-bench.log"
fi
