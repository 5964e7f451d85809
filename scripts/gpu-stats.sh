#!/bin/bash
# On the GPU machine, from the repository root: replays the GPT-2 training trace through
# gpumem's pool on CUDA (its memory_summary(), and a trace recorded by the process-wide Recorder,
# plotted by gpumem-trace) and through PyTorch's caching allocator (torch.cuda.memory_summary()),
# so that the two tables can be shown side by side. Everything goes to $OUT.
#
# Stage the programs first, on a machine with Rust, and send .gpu/ along:
#   scripts/gpu-stage --features cuda --no-tests --example 08-replay-stats --bin gpumem-trace
# The trace is $TRACE, else $OUT/training.trace, else recorded here with
# bench/record_training_trace.py (GPT-2 small, 3 steps; needs transformers).
set -u
OUT=${OUT:-/tmp/gpumem-stats}
mkdir -p "$OUT"
REPLAY=${GPUMEM_REPLAY:-.gpu/bins/08-replay-stats}
TOOL=${GPUMEM_TRACE:-.gpu/bins/gpumem-trace}
TRACE=${TRACE:-$OUT/training.trace}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"

if [ ! -f "$TRACE" ]; then
    echo "== recording the GPT-2 trace"
    PYTHONUNBUFFERED=1 python3 bench/record_training_trace.py gpt2 "$TRACE" > "$OUT/record.log" 2>&1 || rc=1
    tail -3 "$OUT/record.log"
fi

echo "== gpumem (CUDA)"
if [ -x "$REPLAY" ]; then
    "$REPLAY" "$TRACE" --record "$OUT/training.gpumem.jsonl" > "$OUT/gpumem-summary.txt" 2> "$OUT/gpumem.log" || rc=1
    cat "$OUT/gpumem-summary.txt" "$OUT/gpumem.log"
else
    echo "no $REPLAY: stage it (see the top of this script)"
    rc=1
fi

echo "== PyTorch"
python3 scripts/torch_replay_summary.py "$TRACE" > "$OUT/torch-summary.txt" 2> "$OUT/torch.log" || rc=1
cat "$OUT/torch-summary.txt" "$OUT/torch.log"

if [ -x "$TOOL" ] && [ -f "$OUT/training.gpumem.jsonl" ]; then
    echo "== gpumem-trace on the recorded replay"
    "$TOOL" stats "$OUT/training.gpumem.jsonl" --top 10 > "$OUT/training.stats.txt" 2>&1 || rc=1
    "$TOOL" plot "$OUT/training.gpumem.jsonl" -o "$OUT/training.svg" --max-bands 300 \
        --title "GPT-2 small, 3 training steps, replayed through gpumem on the GPU" 2>&1 || rc=1
    "$TOOL" plot "$OUT/training.gpumem.jsonl" -o "$OUT/training.html" 2>&1 || rc=1
    head -12 "$OUT/training.stats.txt"
    gzip -f "$OUT/training.gpumem.jsonl"
fi
exit $rc
