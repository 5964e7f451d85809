#!/usr/bin/env python3
"""The anchors of gpumem's GPU benchmark: CuPy's MemoryPool and PyTorch's caching allocator on the
same machine, the same sizes and the same traces, in the same run.

Writes DIR/anchors.txt, one `key value` per line, which `cargo bench -p gpumem-benches --bench gpu` reads through
GPUMEM_BENCH_DIR. DIR must hold random.trace (written by the benchmark with --write-trace) and may
hold training.trace and bert.trace (bench/record_training_trace.py) and random_seedN.trace, the
random trace on one stream from other seeds (--write-seeds).

Fragmentation: every trace replayed through CuPy's MemoryPool (its raw allocations and frees
counted through a counting allocator) and PyTorch's caching allocator, default and with
expandable_segments:True (each in a child process, as PyTorch reads its configuration once;
raw calls are num_device_alloc / num_device_free of torch.cuda.memory_stats()): peak held over
peak in use, raw allocations, raw frees, and the replay's wall time to a final synchronisation,
the median of 5 replays after a warm-up, each from an empty cache.

PyTorch's allocator is timed from C++ (raw_alloc_with_stream / raw_delete, compiled here with
torch.utils.cpp_extension), so Python's overhead is not counted against it; CuPy's only entry
point is Python, so it is timed through cupy.cuda.alloc as its users call it.

Usage: python3 bench/anchors.py DIR [fragmentation]   (with `fragmentation`: only those anchors)
"""
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import weakref

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


# The CPU of the single-thread anchors, the same as the benchmark's allocation rows (see
# `bench_cpu` in benches/gpu/timing.rs: this machine's CPUs run the same code at different speeds).
BENCH_CPU = int(os.environ.get("GPUMEM_BENCH_CPU", "3"))


class on_bench_cpu:
    """Pins the calling thread to BENCH_CPU for the `with` block (unpinned where it does not
    exist), and gives it back every CPU it had after."""

    def __enter__(self):
        self.allowed = os.sched_getaffinity(0)
        if BENCH_CPU in self.allowed:
            os.sched_setaffinity(0, {BENCH_CPU})

    def __exit__(self, *exc):
        os.sched_setaffinity(0, self.allowed)


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
    with on_bench_cpu():
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

        with on_bench_cpu():
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
    """The trace's steps, and where its second and third training steps begin (as many of the two
    as it marks): the step in which the optimizer's state first lives beside the activations, and
    the steps after it, in which a loop that settles makes no raw call."""
    steps, marks = [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if line.startswith("# step"):
                marks.append(len(steps))
            if not parts or parts[0].startswith("#"):
                continue
            if parts[0] == "a":
                steps.append(("a", int(parts[1]), int(parts[2]), int(parts[3])))
            else:
                steps.append(("f", int(parts[1])))
    return steps, marks[1:3]


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


REPLAYS = 5
TRACES = ("random", "training", "bert")


def n_streams(steps):
    return 1 + max(s[3] for s in steps if s[0] == "a")


def timed_replays(once):
    """One warm-up replay, then REPLAYS timed ones: the median time, the counts and ratio of the
    first timed one (every replay starts from an empty cache, so they repeat)."""
    once()
    runs = [once() for _ in range(REPLAYS)]
    first = dict(runs[0])
    first["ms"] = statistics.median(r["ms"] for r in runs)
    for field in ("in_step2", "from_step3"):
        if first.get(field) is None:
            first.pop(field, None)
    return first


class _CountedMemory(cp.cuda.Memory):
    """cupy.cuda.Memory, weakly referenceable, so its frees can be counted."""


def split_by_marks(at_marks, marks, end):
    """The raw calls in the second step and from the third on, from the counts read at each mark
    reached (None for a step the trace does not mark)."""
    at = at_marks + [end] * (len(marks) - len(at_marks)) + [end]
    parts = [b - a for a, b in zip(at, at[1:])]
    return {"in_step2": parts[0] if len(parts) > 0 else None, "from_step3": parts[1] if len(parts) > 1 else None}


def cupy_replay_once(steps, marks, in_use, streams):
    counts = {"allocs": 0, "frees": 0}

    def freed():
        counts["frees"] += 1

    def counting(size):
        # cupy.cuda.Memory is an extension type without weak references; a Python subclass has
        # them, and frees the same way.
        mem = _CountedMemory(size)
        counts["allocs"] += 1
        weakref.finalize(mem, freed)
        return cp.cuda.MemoryPointer(mem, 0)

    pool = cp.cuda.MemoryPool(counting)
    live, peak, at_marks = {}, 0, []
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for i, s in enumerate(steps):
        while len(at_marks) < len(marks) and marks[len(at_marks)] == i:
            at_marks.append(counts["allocs"] + counts["frees"])
        if s[0] == "a":
            with streams[s[3]]:
                live[s[1]] = pool.malloc(s[2])
            peak = max(peak, pool.total_bytes())
        else:
            live.pop(s[1], None)
    live.clear()
    cp.cuda.Device().synchronize()
    ms = (time.perf_counter() - t) * 1e3
    result = {"ratio": peak / in_use, "allocs": counts["allocs"], "frees": counts["frees"], "ms": ms}
    result.update(split_by_marks(at_marks, marks, counts["allocs"] + counts["frees"]))
    pool.free_all_blocks()
    return result


def cupy_replay(steps, marks, in_use):
    streams = [cp.cuda.Stream.null] + [cp.cuda.Stream(non_blocking=True) for _ in range(n_streams(steps) - 1)]
    return timed_replays(lambda: cupy_replay_once(steps, marks, in_use, streams))


def raw_calls():
    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0) + stats.get("num_device_free", 0)


def torch_replay_once(steps, marks, in_use, streams):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()
    base = torch.cuda.memory_reserved()
    live, at_marks = {}, []
    t = time.perf_counter()
    for i, s in enumerate(steps):
        while len(at_marks) < len(marks) and marks[len(at_marks)] == i:
            at_marks.append(raw_calls())
        if s[0] == "a":
            live[s[1]] = torch.cuda.caching_allocator_alloc(s[2], 0, streams[s[3]])
        else:
            p = live.pop(s[1], None)
            if p is not None:
                torch.cuda.caching_allocator_delete(p)
    for p in live.values():
        torch.cuda.caching_allocator_delete(p)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3
    after = torch.cuda.memory_stats()
    # Raw calls in the second step and from the third to the end of the replay, read before
    # empty_cache below gives every segment back (those frees are not the replay's).
    later = split_by_marks(at_marks, marks, raw_calls())
    peak = torch.cuda.max_memory_reserved() - base
    torch.cuda.empty_cache()
    return {
        "ratio": peak / in_use,
        "allocs": after.get("num_device_alloc", 0) - before.get("num_device_alloc", 0),
        "frees": after.get("num_device_free", 0) - before.get("num_device_free", 0),
        **later,
        "ms": ms,
    }


def torch_fragmentation_child(directory, out_path):
    """Run in a child process, so that PYTORCH_CUDA_ALLOC_CONF (read once, when CUDA starts) can
    differ from the parent's: replays every trace through PyTorch's allocator as configured."""
    out = {}
    for name, (steps, marks) in load_traces(directory):
        in_use = peak_in_use(steps)
        streams = [torch.cuda.default_stream()] + [torch.cuda.Stream() for _ in range(n_streams(steps) - 1)]
        r = timed_replays(lambda: torch_replay_once(steps, marks, in_use, streams))
        for field, v in r.items():
            out[f"{name}_{field}"] = v
    with open(out_path, "w") as f:
        json.dump(out, f)


def load_traces(directory):
    for name in TRACES:
        path = os.path.join(directory, f"{name}.trace")
        if os.path.exists(path):
            steps, marks = read_trace(path)
            if name == "random":
                # The same trace with every allocation on one stream (gpumem's
                # trace::on_one_stream): the allocator's own fragmentation, no stream's memory apart.
                one = [("a", s[1], s[2], 0) if s[0] == "a" else s for s in steps]
                yield "random_one_stream", (one, marks)
            yield name, (steps, marks)
    # The random trace on one stream from other seeds (the benchmark's --write-seeds), so that
    # each allocator's figure on the standard seed is read beside its spread over seeds.
    seeds = [
        f[len("random_seed") : -len(".trace")]
        for f in os.listdir(directory)
        if f.startswith("random_seed") and f.endswith(".trace")
    ]
    for seed in sorted(int(s) for s in seeds if s.isdigit()):
        name = f"random_seed{seed}"
        yield name, read_trace(os.path.join(directory, f"{name}.trace"))


def fragmentation(out, directory):
    for name, (steps, marks) in load_traces(directory):
        in_use = peak_in_use(steps)
        for field, v in cupy_replay(steps, marks, in_use).items():
            out[f"cupy_frag_{name}_{field}"] = v
    for variant, conf in (("torch_default", None), ("torch_expandable", "expandable_segments:True")):
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        result = os.path.join(directory, f"{variant}.json")
        subprocess.run([sys.executable, __file__, "--torch-replay", directory, result], env=env, check=True)
        with open(result) as f:
            for key, v in json.load(f).items():
                name, field = key.rsplit("_", 1)
                out[f"{variant}_frag_{name}_{field}"] = v


def main(directory, only=None):
    out = {}
    for part in () if only == "fragmentation" else (torch_cpp, cupy_alloc):
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
    if len(sys.argv) == 4 and sys.argv[1] == "--torch-replay":
        torch_fragmentation_child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
