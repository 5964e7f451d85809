#!/usr/bin/env python3
"""PyTorch's caching allocator (default and expandable_segments:True) and CuPy's MemoryPool over
many seeds of the random trace, beside gpumem's `--sweep-seeds`: what one seed's figure is worth.

Reads DIR/random_seed1.trace to DIR/random_seedN.trace (the benchmark's `--write-seeds DIR N`),
replays each once through each allocator (as bench/anchors.py replays them; PyTorch in a child
process per configuration, as it reads its configuration once) and prints, per allocator, held
over in use (mean, median, least, most) and the mean of its raw allocations.

Usage: python3 bench/seed_sweep.py DIR N
"""
import json
import os
import statistics
import subprocess
import sys

import anchors


def traces(directory, n):
    for seed in range(1, n + 1):
        yield anchors.read_trace(os.path.join(directory, f"random_seed{seed}.trace"))


def torch_child(directory, n, out_path):
    """In a child process: every seed once through PyTorch's allocator as configured."""
    import torch

    streams = [torch.cuda.default_stream()]
    out = []
    for steps, marks in traces(directory, n):
        r = anchors.torch_replay_once(steps, marks, anchors.peak_in_use(steps), streams)
        out.append({"ratio": r["ratio"], "allocs": r["allocs"]})
    with open(out_path, "w") as f:
        json.dump(out, f)


def cupy_runs(directory, n):
    import cupy as cp

    streams = [cp.cuda.Stream.null]
    return [
        anchors.cupy_replay_once(steps, marks, anchors.peak_in_use(steps), streams)
        for steps, marks in traces(directory, n)
    ]


def summary(name, runs, n):
    ratios = sorted(r["ratio"] for r in runs)
    allocs = statistics.mean(r["allocs"] for r in runs)
    print(
        f"{name:<42} mean {statistics.mean(ratios):.4f}  median {statistics.median(ratios):.4f}  "
        f"least {ratios[0]:.4f}  most {ratios[-1]:.4f}  raw allocations {allocs:>7.1f}  ({n} seeds)"
    )


def main(directory, n):
    print(f"random trace on one stream, seeds 1 to {n}: held / in use, and raw allocations")
    for name, conf in (
        ("PyTorch caching allocator, default", None),
        ("PyTorch, expandable_segments:True", "expandable_segments:True"),
    ):
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        result = os.path.join(directory, "seed_sweep_torch.json")
        subprocess.run([sys.executable, __file__, "--torch", directory, str(n), result], env=env, check=True)
        with open(result) as f:
            summary(name, json.load(f), n)
    summary("CuPy MemoryPool", cupy_runs(directory, n), n)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--torch":
        torch_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) == 3:
        main(sys.argv[1], int(sys.argv[2]))
    else:
        sys.exit(__doc__)
