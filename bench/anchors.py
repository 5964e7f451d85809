#!/usr/bin/env python3
"""The anchors of gpumem's GPU benchmark: CuPy's MemoryPool and PyTorch's caching allocator on the
same machine, the same sizes and the same traces, in the same run.

Writes DIR/anchors.txt, one `key value` per line, which `cargo bench --bench gpu` reads through
GPUMEM_BENCH_DIR. DIR must hold random.trace (written by the benchmark with --write-trace) and may
hold training.trace (bench/record_training_trace.py).

PyTorch's allocator is timed from C++ (raw_alloc_with_stream / raw_delete, compiled here with
torch.utils.cpp_extension), so Python's overhead is not counted against it; CuPy's only entry
point is Python, so it is timed through cupy.cuda.alloc as its users call it.

Usage: python3 bench/anchors.py DIR
"""
import io
import os
import statistics
import sys
import threading
import time

import cupy as cp
import torch
import torch.utils.cpp_extension

SIZES = (512, 1 << 20, 64 << 20)

TORCH_CPP = r"""
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

static double pairs(size_t size, long iters, cudaStream_t s) {
  auto t = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) {
    void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, s);
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Nanoseconds per allocate + free pair on one non-blocking stream, the median of 5 rounds.
double ns_per_pair(int64_t size, int64_t iters) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  pairs(size, 1000, s);
  std::vector<double> v;
  for (int r = 0; r < 5; ++r) v.push_back(pairs(size, iters, s) / iters * 1e9);
  std::sort(v.begin(), v.end());
  cudaStreamDestroy(s);
  return v[2];
}

// Aggregate millions of 4 KiB pairs per second of `threads` threads, each on its own stream.
double threads_rate(int64_t threads, int64_t iters) {
  std::vector<double> secs(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      pairs(4096, 1000, s);
      secs[t] = pairs(4096, iters, s);
      cudaStreamDestroy(s);
    });
  }
  for (auto& th : pool) th.join();
  return threads * iters / *std::max_element(secs.begin(), secs.end()) / 1e6;
}
"""


def median_of(rounds, f):
    return statistics.median(f() for _ in range(rounds))


def torch_cpp(out):
    ext = torch.utils.cpp_extension.load_inline(
        name="gpumem_torch_anchor",
        cpp_sources=TORCH_CPP,
        functions=["ns_per_pair", "threads_rate"],
        with_cuda=True,
        extra_cflags=["-O2"],
        verbose=False,
    )
    torch.zeros(1, device="cuda")
    for size in SIZES:
        out[f"torch_cpp_ns_{size}"] = ext.ns_per_pair(size, 200_000)
    for n in (1, 4, 8):
        out[f"torch_cpp_threads_{n}"] = ext.threads_rate(n, 200_000)


def cupy_alloc(out):
    pool = cp.cuda.MemoryPool()
    cp.cuda.set_allocator(pool.malloc)
    alloc = cp.cuda.alloc
    for size in SIZES:
        n = 100_000
        del_ = alloc(size)
        del del_

        def one_round():
            t = time.perf_counter()
            for _ in range(n):
                m = alloc(size)
                del m
            return (time.perf_counter() - t) / n * 1e9

        out[f"cupy_ns_{size}"] = median_of(5, one_round)

    for threads in (1, 4, 8):
        n = 50_000
        secs = [0.0] * threads
        start = threading.Barrier(threads)

        def work(i):
            with cp.cuda.Stream(non_blocking=True):
                for _ in range(1000):
                    m = alloc(4096)
                    del m
                start.wait()
                t = time.perf_counter()
                for _ in range(n):
                    m = alloc(4096)
                    del m
                secs[i] = time.perf_counter() - t

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[f"cupy_threads_{threads}"] = threads * n / max(secs) / 1e6

    from cupy.cuda import memory_hooks

    n = 50_000
    m = alloc(512)
    del m
    with memory_hooks.DebugPrintHook(file=io.StringIO(), flush=False):
        t = time.perf_counter()
        for _ in range(n):
            m = alloc(512)
            del m
        elapsed = time.perf_counter() - t
    # Two events (malloc, free) per cache-hit pair.
    out["cupy_debugprint_mevents"] = 2 * n / elapsed / 1e6
    pool.free_all_blocks()
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)


def read_trace(path):
    steps = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if parts[0] == "a":
                steps.append(("a", int(parts[1]), int(parts[2]), int(parts[3])))
            else:
                steps.append(("f", int(parts[1])))
    return steps


def peak_in_use(steps):
    live, used, peak = {}, 0, 0
    for s in steps:
        if s[0] == "a":
            live[s[1]] = s[2]
            used += s[2]
            peak = max(peak, used)
        else:
            used -= live.pop(s[1], 0)
    return peak


def cupy_replay(steps):
    pool = cp.cuda.MemoryPool()
    n_streams = 1 + max(s[3] for s in steps if s[0] == "a")
    streams = [cp.cuda.Stream.null] + [cp.cuda.Stream(non_blocking=True) for _ in range(n_streams - 1)]
    live, peak = {}, 0
    for s in steps:
        if s[0] == "a":
            with streams[s[3]]:
                live[s[1]] = pool.malloc(s[2])
            peak = max(peak, pool.total_bytes())
        else:
            live.pop(s[1], None)
    live.clear()
    pool.free_all_blocks()
    return peak


def torch_replay(steps):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    n_streams = 1 + max(s[3] for s in steps if s[0] == "a")
    streams = [torch.cuda.default_stream()] + [torch.cuda.Stream() for _ in range(n_streams - 1)]
    live = {}
    for s in steps:
        if s[0] == "a":
            live[s[1]] = torch.cuda.caching_allocator_alloc(s[2], 0, streams[s[3]])
        else:
            p = live.pop(s[1], None)
            if p is not None:
                torch.cuda.caching_allocator_delete(p)
    for p in live.values():
        torch.cuda.caching_allocator_delete(p)
    peak = torch.cuda.max_memory_reserved() - base
    torch.cuda.empty_cache()
    return peak


def fragmentation(out, directory):
    for name in ("random", "training"):
        path = os.path.join(directory, f"{name}.trace")
        if not os.path.exists(path):
            continue
        steps = read_trace(path)
        in_use = peak_in_use(steps)
        out[f"cupy_frag_{name}"] = cupy_replay(steps) / in_use
        out[f"torch_frag_{name}"] = torch_replay(steps) / in_use


def main(directory):
    out = {}
    for part in (torch_cpp, cupy_alloc):
        try:
            part(out)
        except Exception as e:  # a failed anchor is reported, not fatal: the table shows "-"
            print(f"anchors: {part.__name__} failed: {e!r}", file=sys.stderr)
    try:
        fragmentation(out, directory)
    except Exception as e:
        print(f"anchors: fragmentation failed: {e!r}", file=sys.stderr)
    with open(os.path.join(directory, "anchors.txt"), "w") as f:
        for k, v in sorted(out.items()):
            f.write(f"{k} {v}\n")
    for k, v in sorted(out.items()):
        print(f"{k:32} {v:12.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
