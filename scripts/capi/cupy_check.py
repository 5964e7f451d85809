#!/usr/bin/env python3
"""CuPy with gpumem's pool as its allocator (through the C ABI), against CuPy's own pool, in one
process:

1. A workload (elementwise, a custom kernel, reductions, scans, sorting, FFTs, matrix products,
   part of it on a second stream, many sizes) run with CuPy's pool, then with gpumem's; every
   result must be bit-identical.
2. CuPy's DebugPrintHook example (the seed document): with CuPy's pool and CuPy's hook, then with
   gpumem's pool and gpumem's hook (same JSON lines); the hook names, device, sizes and rounded
   sizes must be equal.
3. Pool behaviour that still makes sense through a foreign allocator: CuPy's own pool is bypassed,
   sizes are rounded to 512 bytes, a freed chunk is reused, free_all_blocks releases whole
   blocks, and a limit gives CuPy's OutOfMemoryError with CuPy's message.

Writes RESULT.json with every check; exits 1 if any fails.

Usage: python3 scripts/capi/cupy_check.py --lib libgpumem_capi.so --out RESULT.json
"""
import argparse
import io
import json
import os
import re
import sys

import cupy
import numpy as np
from cupy.cuda import memory_hooks

HERE = os.path.dirname(os.path.abspath(__file__))
import gpumem_alloc  # noqa: E402

checks = []


def check(name, ok, **detail):
    checks.append({"check": name, "ok": bool(ok), **detail})
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f" {detail}" if detail and not ok else ""), flush=True)


def workload():
    rs = cupy.random.RandomState(seed=1)
    x = rs.standard_normal((1024, 1024), dtype=cupy.float32)
    y = rs.standard_normal((1024, 1024), dtype=cupy.float32)
    square_minus = cupy.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a * a - b", "square_minus")
    out = {
        "elementwise": x * 2 + cupy.sin(y),
        "custom_kernel": square_minus(x, y),
        "where": cupy.where(x > 0, x, y),
        "sum": x.sum(),
        "sum_axis0": x.sum(axis=0),
        "max_axis1": y.max(axis=1),
        "argmax": y.argmax(),
        "mean": x.mean(),
        "std_axis1": x.std(axis=1),
        "cumsum": cupy.cumsum(x[0]),
        "sort": cupy.sort(x[0]),
        "fft": cupy.fft.fft(x[:8]),
        "ifft": cupy.fft.ifft(cupy.fft.fft(y[:4])),
        "fft2": cupy.fft.fft2(x[:256, :256]),
        "rfft": cupy.fft.rfft(y[0]),
        "matmul": x @ y,
    }
    # A second (blocking) stream: CuPy's arrays made there come from gpumem's null-stream arena,
    # which a blocking stream is ordered with.
    with cupy.cuda.Stream():
        out["stream_elementwise"] = cupy.exp(x[:64]) - y[:64]
        out["stream_norm"] = cupy.linalg.norm(y[:64], axis=1)
        cupy.cuda.get_current_stream().synchronize()
    # Many sizes, allocated and freed in an interleaved order.
    parts = [cupy.arange(n, dtype=cupy.int64) * (n % 7) for n in (1, 3, 100, 511, 512, 513, 4096, 10**5, 10**6)]
    out["many_sizes"] = cupy.concatenate([p[-1:] + p.sum() for p in parts])
    return {k: cupy.asnumpy(v) for k, v in out.items()}


def debug_print_lines_cupy():
    cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
    buf = io.StringIO()
    with memory_hooks.DebugPrintHook(file=buf):
        x = cupy.array([1, 2, 3])
        del x
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def debug_print_lines_gpumem(path):
    gpumem_alloc.free_all_blocks(0)
    gpumem_alloc.debug_print_hook_begin(path)
    try:
        x = cupy.array([1, 2, 3])
        del x
    finally:
        gpumem_alloc.debug_print_hook_end()
    return [json.loads(line) for line in open(path).read().splitlines()]


def comparable(lines):
    keys = ("hook", "device_id", "size", "mem_size")
    return [{k: line[k] for k in keys if k in line} for line in lines]


def oom_message(exc):
    # "allocated so far" depends on what else the pool holds; the rest is the format.
    return re.sub(r"allocated so far: [\d,]+ bytes", "allocated so far: N bytes", str(exc))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("GPUMEM_CAPI_LIB"), required="GPUMEM_CAPI_LIB" not in os.environ)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = os.path.dirname(os.path.abspath(args.out))

    # 1. The workload with CuPy's pool (the gpumem run follows the hook example below).
    reference = workload()
    cupy_lines = debug_print_lines_cupy()
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    cupy.fft.config.get_plan_cache().clear()  # FFT plans made again, their work areas from gpumem

    allocator = gpumem_alloc.use_in_cupy(args.lib)
    print(f"gpumem {gpumem_alloc.version()} installed as CuPy's allocator (CuPy {cupy.__version__})")

    # 2. CuPy's DebugPrintHook example, first, while gpumem's pool caches nothing (as the example's
    # new MemoryPool), so the raw allocation shows as CuPy's does.
    gpumem_lines = debug_print_lines_gpumem(os.path.join(out_dir, "gpumem-debug-print.jsonl"))
    print("CuPy's pool:  ", *map(json.dumps, cupy_lines), sep="\n  ")
    print("gpumem's pool:", *map(json.dumps, gpumem_lines), sep="\n  ")
    check("DebugPrintHook example: same events, device and sizes", comparable(cupy_lines) == comparable(gpumem_lines),
          cupy=comparable(cupy_lines), gpumem=comparable(gpumem_lines))
    ptrs = [line.get("mem_ptr") for line in gpumem_lines if line["hook"] in ("malloc", "free")]
    check("DebugPrintHook example: the free names the malloc's pointer", len(ptrs) == 2 and ptrs[0] == ptrs[1] != 0)

    # 1, continued: the workload with gpumem's pool.
    before = gpumem_alloc.stats()
    with_gpumem = workload()
    after = gpumem_alloc.stats()
    check("gpumem served the workload", after["n_mallocs"] > before["n_mallocs"],
          mallocs=after["n_mallocs"] - before["n_mallocs"])
    for key, ref in reference.items():
        got = with_gpumem[key]
        same = ref.dtype == got.dtype and ref.shape == got.shape and ref.tobytes() == got.tobytes()
        detail = {}
        if not same and ref.shape == got.shape:
            detail["max_abs_diff"] = float(np.max(np.abs(ref.astype(np.complex128) - got.astype(np.complex128))))
        check(f"workload result {key} bit-identical", same, **detail)

    # 3. Pool behaviour through the foreign allocator.
    cupy_pool = cupy.get_default_memory_pool()
    used0, g0 = cupy_pool.used_bytes(), gpumem_alloc.stats()["used_bytes"]
    a = cupy.empty(1 << 20, dtype=cupy.uint8)
    check("CuPy's own pool is bypassed", cupy_pool.used_bytes() == used0)
    check("gpumem lends the array's bytes", gpumem_alloc.stats()["used_bytes"] - g0 == 1 << 20)
    del a

    own = cupy.cuda.MemoryPool()
    small_own = own.malloc(24)
    g0 = gpumem_alloc.stats()["used_bytes"]
    small = cupy.empty(24, dtype=cupy.uint8)
    check("24 bytes are rounded to 512, as CuPy's pool does",
          gpumem_alloc.stats()["used_bytes"] - g0 == 512 == small_own.mem.size)
    del small, small_own

    b = cupy.empty(1000, dtype=cupy.uint8)
    del b
    raw0 = gpumem_alloc.stats()["n_raw_allocs"]
    c = cupy.empty(1000, dtype=cupy.uint8)
    check("a freed chunk is reused: no driver call", gpumem_alloc.stats()["n_raw_allocs"] == raw0)
    del c

    big = cupy.empty(4 << 20, dtype=cupy.uint8)
    del big
    held = gpumem_alloc.stats()["total_bytes"]
    gpumem_alloc.free_all_blocks(0)
    check("free_all_blocks releases the cached whole block", held - gpumem_alloc.stats()["total_bytes"] >= 4 << 20,
          before=held, after=gpumem_alloc.stats()["total_bytes"])

    cupy.fft.config.get_plan_cache().clear()
    failed0 = gpumem_alloc.stats()["n_failed_mallocs"]
    gpumem_alloc.set_limit(1 << 20, 0)
    try:
        cupy.empty(2 << 20, dtype=cupy.uint8)
        gpumem_error = None
    except cupy.cuda.memory.OutOfMemoryError as e:
        gpumem_error = e
    finally:
        gpumem_alloc.set_limit(0, 0)
    own_limited = cupy.cuda.MemoryPool()
    own_limited.set_limit(size=1 << 20)
    try:
        own_limited.malloc(2 << 20)
        cupy_error = None
    except cupy.cuda.memory.OutOfMemoryError as e:
        cupy_error = e
    check("over the limit: CuPy's OutOfMemoryError", gpumem_error is not None and cupy_error is not None,
          gpumem=str(gpumem_error), cupy=str(cupy_error))
    if gpumem_error is not None and cupy_error is not None:
        check("over the limit: CuPy's message", oom_message(gpumem_error) == oom_message(cupy_error),
              gpumem=str(gpumem_error), cupy=str(cupy_error))
    check("the failure is counted once", gpumem_alloc.stats()["n_failed_mallocs"] - failed0 == 1)
    x = cupy.ones(10)
    check("allocation works again after the limit is lifted", float(x.sum()) == 10.0)
    del x

    final = gpumem_alloc.stats()
    check("no failed free", final["n_failed_frees"] == 0, stats=final)
    result = {"cupy": cupy.__version__, "gpumem": gpumem_alloc.version(), "checks": checks,
              "debug_print": {"cupy": cupy_lines, "gpumem": gpumem_lines}, "gpumem_stats": final,
              "allocator": allocator.__name__}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    failed = [c["check"] for c in checks if not c["ok"]]
    if failed:
        print(f"MISMATCH: {len(failed)} CuPy check(s) failed: {failed}", file=sys.stderr)
        return 1
    print(f"CuPy with gpumem: all {len(checks)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
