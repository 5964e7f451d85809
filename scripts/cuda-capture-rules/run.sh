#!/bin/bash
# Prints what CUDA answers to forks, joins and the other capture cases the host backend mirrors
# (core/src/host/capture.rs), on the GPU machine (nvcc needed), from the repository root:
#   bash scripts/cuda-capture-rules/run.sh
# The answers of CUDA 13 on an H200 are in answers.txt beside this script.
set -eu
DIR=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpumem-capture-rules}
mkdir -p "$OUT"
nvcc -o "$OUT/probe" "$DIR/probe.cu"
"$OUT/probe" | tee "$OUT/answers.txt"
