#!/bin/bash
# On the GPU machine, from the repository root: records the PyTorch snapshot fixture of
# gpumem-trace's importer test, and the snapshot of the GPT-2 training run, then runs the staged
# gpumem-trace on the latter (import, stats, replay, plot). Everything goes to $OUT.
#
# Stage the program first, on a machine with Rust, and send .gpu/ along:
#   scripts/gpu-stage --no-tests --bin gpumem-trace
# Then check the fixture in: copy $OUT/fixture/torch_snapshot.pickle and
# $OUT/fixture/torch_snapshot.stats.json to trace/fixtures/ (build.rs then compiles its test).
set -u
OUT=${OUT:-/tmp/gpumem-trace}
mkdir -p "$OUT/fixture"
TOOL=${GPUMEM_TRACE:-.gpu/bins/gpumem-trace}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"

echo "== fixture"
python3 trace/fixtures/make_torch_snapshot.py "$OUT/fixture" > "$OUT/fixture/log.txt" 2>&1 || rc=1
tail -5 "$OUT/fixture/log.txt"

echo "== training snapshot"
python3 scripts/record_training_snapshot.py "$OUT" > "$OUT/training.log" 2>&1 || rc=1
tail -3 "$OUT/training.log"

if [ -x "$TOOL" ]; then
    for name in fixture/torch_snapshot training_snapshot; do
        [ -f "$OUT/$name.pickle" ] || continue
        echo "== gpumem-trace on $name"
        "$TOOL" import --from pytorch "$OUT/$name.pickle" -o "$OUT/$name.trace" 2>&1 | tee "$OUT/$name.import.txt" || rc=1
        "$TOOL" stats "$OUT/$name.trace" --top 20 > "$OUT/$name.stats.txt" 2>&1 || rc=1
        "$TOOL" stats --json "$OUT/$name.trace" > "$OUT/$name.stats-gpumem.json" 2>&1 || rc=1
        "$TOOL" replay "$OUT/$name.trace" 2>&1 | tee "$OUT/$name.replay.txt" || rc=1
        "$TOOL" plot "$OUT/$name.trace" -o "$OUT/$name.html" 2>&1 || rc=1
        "$TOOL" plot "$OUT/$name.trace" -o "$OUT/$name.svg" 2>&1 || rc=1
        "$TOOL" plot "$OUT/$name.trace" -o "$OUT/$name.by-site.html" --color-by site 2>&1 || rc=1
        head -12 "$OUT/$name.stats.txt"
    done
    # The traces and the training pickle can be large: compress what comes back.
    gzip -f "$OUT"/*.trace "$OUT/training_snapshot.pickle" 2>/dev/null
else
    echo "gpu-trace.sh: $TOOL is missing: stage it with gpu-stage --no-tests --bin gpumem-trace" | tee -a "$OUT/gpu.txt"
    rc=1
fi
echo "gpu-trace.sh: exit $rc (results in $OUT)"
exit $rc
