#!/bin/bash
# Prints what CUDA answers to forks, joins and the other capture cases the host backend mirrors
# (core/src/host/capture.rs), on the GPU machine (nvcc needed), from the repository root:
#   bash scripts/cuda-capture-rules/run.sh
# The answers of CUDA 13 on an H200 are in answers.txt beside this script; legacy-race.cu shows
# the driver crash that backend-cuda/src/legacy.rs avoids (exit 139 is a segmentation fault).
set -eu
DIR=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpumem-capture-rules}
mkdir -p "$OUT"
nvcc -o "$OUT/probe" "$DIR/probe.cu"
"$OUT/probe" | tee "$OUT/answers.txt"
nvcc -o "$OUT/legacy-race" "$DIR/legacy-race.cu" -lpthread
for stream in 0 1; do
    for legacy in 0 1 2; do
        timeout 60 "$OUT/legacy-race" "$stream" "$legacy" > /dev/null 2>&1
        echo "legacy-race stream=$stream legacy=$legacy: exit $?"
    done
done | tee "$OUT/legacy-race.txt"
