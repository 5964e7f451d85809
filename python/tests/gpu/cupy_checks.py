"""gpumem under CuPy, from the installed wheel: results identical to CuPy's own pool for a set of
memory-using operations, an allocation past the limit as cupy.cuda.memory.OutOfMemoryError (and
the program goes on), statistics, recorder and snapshot. Prints "ok"/"FAIL"; exits 1 on failure.

    python cupy_checks.py OUTDIR
"""
import json
import os
import sys

import cupy
import numpy as np

import gpumem_runtime.cupy as gpumem
from checks import check, finish

out = sys.argv[1]


def workload():
    rng = cupy.random.RandomState(7)
    a = rng.standard_normal((512, 384), dtype=cupy.float32)
    b = rng.standard_normal((384, 256), dtype=cupy.float32)
    parts = [a @ b, cupy.cumsum(a, axis=1), cupy.sort(a.ravel()), cupy.fft.fft(a[0]).real,
             cupy.concatenate([a.ravel(), b.ravel()]), (a[:, :256] > 0).astype(cupy.int32)]
    for size in (1, 511, 512, 513, 1 << 20):
        parts.append(cupy.arange(size, dtype=cupy.float64) * 0.5)
    return [cupy.asnumpy(p) for p in parts]


reference = workload()
cupy.get_default_memory_pool().free_all_blocks()
gpumem.enable(limit=1 << 30, device=0)
check("gpumem is CuPy's allocator", gpumem.is_enabled())
with gpumem.Recording(os.path.join(out, "cupy-trace.jsonl")) as rec:
    result = workload()
check("results identical to CuPy's pool", all(np.array_equal(x, y) for x, y in zip(reference, result)))
check("the recorder wrote the workload's allocations", rec.lines > 20, str(rec.lines))
try:
    cupy.empty(2 << 30, dtype=cupy.uint8)
    check("allocation past the limit raises OutOfMemoryError", False, "no exception")
except cupy.cuda.memory.OutOfMemoryError as e:
    check("allocation past the limit raises OutOfMemoryError", "Out of memory" in str(e), str(e)[:200])
x = cupy.ones(1000)
check("the program goes on after the OOM", float(x.sum()) == 1000.0)
stats = gpumem.memory_stats()
check("memory_stats", stats["num_ooms"] >= 1 and stats["allocated_bytes.all.current"] >= 8000, json.dumps(stats)[:200])
snap = gpumem.snapshot()
check("snapshot lists x", any(b["address"] == x.data.ptr for s in snap["segments"] for b in s["blocks"]))
gpumem.disable()
finish()
