#!/bin/bash
# The Python package on the GPU machine, from its installed CUDA wheel in a fresh venv (with the
# system's torch, cupy and transformers; no repository on sys.path): GPT-2 training steps with
# PyTorch's allocator and with gpumem's (two processes, losses compared bit for bit), PyTorch's
# checks (torch.OutOfMemoryError past a limit, record_stream, statistics, a snapshot that
# torch.cuda._memory_viz turns into pages), CuPy's checks, and CuPy's own memory tests with and
# without gpumem where CuPy's tests are found (CuPy's wheels do not ship them: put the `tests/`
# folder of CuPy's source distribution of the installed version anywhere under .gpu-python/).
#
# Needs the CUDA wheel, built on a machine with Rust:
#   (cd python && maturin build --release --features cuda -o ../.gpu-python/wheel)
# Logs go to $OUT (or /tmp/gpumem-python). Exit status: non-zero when any check failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
OUT=${OUT:-/tmp/gpumem-python}
mkdir -p "$OUT"
WHEEL=$(ls "$REPO"/.gpu-python/wheel/gpumem_runtime-*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || { echo "gpu-python: no wheel in .gpu-python/wheel" >&2; exit 1; }
GPU=$REPO/python/tests/gpu
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 GPUMEM_RUNTIME_CACHE=/tmp/gpumem-runtime-cache

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, cupy, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
    command -v c++ g++ || echo "no C++ compiler"
    CUPY_DIR=$(python3 -c "import cupy, os; print(os.path.dirname(cupy.__file__))")
    echo "cupy at $CUPY_DIR"
} 2>&1 | tee "$OUT/environment.txt"

# A fresh venv that sees the frameworks' site-packages (the system's, or those of the venv that
# python3 belongs to: --system-site-packages alone would reach only its base interpreter's).
VENV=/tmp/gpumem-venv
rm -rf "$VENV"
python3 -m venv --system-site-packages "$VENV" || exit 1
PY=$VENV/bin/python
python3 -c "import site; print('\n'.join(site.getsitepackages()))" > "$("$PY" -c "import site; print(site.getsitepackages()[0])")/frameworks.pth"
"$PY" -m pip install -q --no-index --no-deps "$WHEEL" || exit 1
cd /tmp || exit 1   # nothing of the repository on sys.path

status=0
run() { # name, command...
    local name=$1; shift
    echo "== $name"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    if [ $rc -ne 0 ]; then echo "gpu-python: $name FAILED (exit $rc)" >&2; status=1; fi
}

run train-torch "$PY" "$GPU/train_gpt2.py" --allocator torch --out "$OUT/train-torch.json"
run train-gpumem "$PY" "$GPU/train_gpt2.py" --allocator gpumem --out "$OUT/train-gpumem.json" \
    --record /tmp/train-gpumem.jsonl --snapshot "$OUT/train-snapshot.pickle"
echo "== losses"
"$PY" - "$OUT/train-torch.json" "$OUT/train-gpumem.json" <<'PYEOF' || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
same = a["losses"] == b["losses"] and len(a["losses"]) > 0
print(f"{len(a['losses'])} steps; losses bit-identical: {same}; first {float.fromhex(a['losses'][0])}, last {float.fromhex(a['losses'][-1])}")
print("gpumem recorded", b.get("recorded_lines"), "lines from", b.get("recorded_threads"), "threads; stats", b.get("stats"))
sys.exit(0 if same else 1)
PYEOF
run torch-checks "$PY" "$GPU/torch_checks.py" "$OUT"
run cupy-checks "$PY" "$GPU/cupy_checks.py" "$OUT"

# CuPy's own tests of cupy.cuda.memory, where they are installed (CuPy's wheels do not ship them).
TESTS=$(find / -xdev -path '*cupy_tests/cuda_tests/test_memory.py' 2>/dev/null | head -n 1)
# They pass with gpumem when they give the same outcome as on CuPy's own pool: the same tests
# fail either way (those that need a second GPU, on a one-GPU machine).
if [ -n "$TESTS" ]; then
    echo "== cupy-tests ($TESTS)"
    "$PY" -m pytest -q -rf -p no:cacheprovider "$TESTS" > "$OUT/cupy-tests-own-pool.log" 2>&1
    PYTHONPATH=$GPU "$PY" -m pytest -q -rf -p no:cacheprovider -p cupy_plugin "$TESTS" > "$OUT/cupy-tests-gpumem.log" 2>&1
    for pool in own-pool gpumem; do
        grep -E "^FAILED|^ERROR" "$OUT/cupy-tests-$pool.log" | sed 's/ - .*//' | sort > "$OUT/cupy-tests-$pool.failed"
        echo "$pool: $(tail -n 1 "$OUT/cupy-tests-$pool.log")"
    done
    if cmp -s "$OUT/cupy-tests-own-pool.failed" "$OUT/cupy-tests-gpumem.failed" \
        && grep -q " passed" "$OUT/cupy-tests-gpumem.log"; then
        echo "CuPy's tests: the same outcome on gpumem as on CuPy's pool"
    else
        echo "gpu-python: CuPy's tests differ on gpumem from CuPy's pool" >&2
        diff "$OUT/cupy-tests-own-pool.failed" "$OUT/cupy-tests-gpumem.failed"
        status=1
    fi
else
    echo "== CuPy's own tests are not installed here: cupy_checks.py covers the allocator's users" | tee "$OUT/cupy-tests.txt"
fi
echo "gpu-python: exit $status"
exit $status
