#!/bin/bash
# BENCHMARKS.md's memory table, in one run on the GPU machine:
#   replays   the random trace (standard seed, on four streams and on one) and the recorded GPT-2
#             and BERT training traces replayed on the device through gpumem's pool, then through
#             PyTorch's caching allocator (default and expandable_segments:True) and CuPy's
#             MemoryPool (bench/anchors.py); the random trace on one stream over seeds 1 to 50
#             through gpumem's pool (--sweep-seeds, whose figures depend only on the pool's rules)
#             and through PyTorch's two modes and CuPy on the device (bench/seed_sweep.py);
#   programs  the PyTorch programs of bench/pytorch_programs.py through the C ABI under PyTorch's
#             default, its expandable_segments:True, gpumem's C ABI default, stitching
#             (GPUMEM_STITCH=1), and fixed blocks and stitching each planned with no step call,
#             each in its own process (bench/pytorch-programs.sh; RUNS names others).
#
# Staged first, on a machine with Rust:
#   scripts/gpu-stage --bench --no-tests          (the benchmark, in .gpu/benches/)
#   cargo build --release -p gpumem-capi --features cuda
# with GPUMEM_CAPI_LIB pointing at the library. Usage:
#   bash bench/memory-table.sh [replays|programs]     (default: both)
# PROGRAMS limits the programs (as bench/pytorch-programs.sh reads it). Results go to $OUT
# (default /tmp/gpumem-memory-table): replays/ and programs/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpumem-memory-table}
PART=${1:-all}
mkdir -p "$OUT"
if [ "$PART" != programs ]; then
    BIN=$(ls .gpu/benches/gpu-* | head -n 1)
    D="$OUT/replays"
    mkdir -p "$D/sweep"
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    } > "$D/machine.txt"
    "$BIN" --write-trace "$D/random.trace"
    "$BIN" --write-seeds "$D"
    cp core/tests/fixtures/gpt2-training.trace "$D/training.trace"
    cp core/tests/fixtures/bert-finetuning.trace "$D/bert.trace"
    # The anchors first: the benchmark reads them (anchors.txt) into its table.
    PYTHONUNBUFFERED=1 python3 bench/anchors.py "$D" fragmentation > "$D/anchors.log" 2>&1
    GPUMEM_BENCH_ONLY=fragmentation GPUMEM_BENCH_DIR="$D" "$BIN" > "$D/gpu-bench.log" 2>&1
    "$BIN" --sweep-seeds 50 > "$D/sweep/gpumem.txt" 2>&1
    "$BIN" --write-seeds "$D/sweep" 50
    PYTHONUNBUFFERED=1 python3 bench/seed_sweep.py "$D/sweep" 50 > "$D/sweep/anchors.txt" 2>&1
    # Each trace's peak in use, for the table's bytes (the traces are not kept).
    python3 -c '
import json, os, sys
sys.path.insert(0, "bench")
import anchors
d = sys.argv[1]
use = {n: anchors.peak_in_use(anchors.read_trace(os.path.join(d, n + ".trace"))[0]) for n in ("random", "training", "bert")}
use["random_one_stream"] = use["random"]
json.dump(use, open(os.path.join(d, "in_use.json"), "w"))
' "$D"
    rm -f "$D"/*.trace "$D"/sweep/*.trace
fi
if [ "$PART" != replays ]; then
    RUNS=${RUNS:-torch torch-expandable default stitch auto-fixed auto-stitch} OUT="$OUT/programs" bash bench/pytorch-programs.sh
fi
python3 bench/memory_table.py "$OUT" | tee "$OUT/memory-table.md"
