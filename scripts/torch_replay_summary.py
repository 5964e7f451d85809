#!/usr/bin/env python3
"""Replays an allocation trace (bench/record_training_trace.py's text format: `a <id> <size>
<stream>`, `f <id>`, `# step N`) through PyTorch's CUDA caching allocator and prints
torch.cuda.memory_summary(), for the same trace that examples/08-replay-stats.rs replays through
gpumem's pool.

Each allocation is torch.empty(size, dtype=torch.uint8) on the trace's stream (0: the current
stream, others a torch.cuda.Stream each); nothing is written to the memory.

Usage: python3 scripts/torch_replay_summary.py TRACE
"""
import sys

import torch


def main():
    path = sys.argv[1]
    streams = {}
    live = {}
    steps = 0
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if parts[0] == "a":
                ident, size, stream = int(parts[1]), int(parts[2]), int(parts[3])
                if stream == 0:
                    live[ident] = torch.empty(size, dtype=torch.uint8, device="cuda")
                else:
                    s = streams.setdefault(stream, torch.cuda.Stream())
                    with torch.cuda.stream(s):
                        live[ident] = torch.empty(size, dtype=torch.uint8, device="cuda")
            elif parts[0] == "f":
                live.pop(int(parts[1]), None)
            else:
                raise SystemExit(f"{path}: unknown line {line!r}")
            steps += 1
    torch.cuda.synchronize()
    print(f"{steps} steps replayed through torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(torch.cuda.memory_summary())
    live.clear()


if __name__ == "__main__":
    main()
