#!/usr/bin/env python3
"""Placement rules on one growing block, replayed over trace files: how much the rule that picks a
hole for a request moves what the block holds over the peak in use.

A model, not gpumem: one block that grows at its end in 2 MiB granules (a request above 1 MiB by at
least 20 MiB or 1/64 of the block, as gpumem's expandable segments), requests rounded to 512 B,
freed chunks merged with free neighbours, nothing ever given back. The rules:

  best-fit        the smallest hole that holds the request, the free tail last (gpumem's rule)
  best-fit-tail   the same, with the free tail lent like any other hole
  first-fit       the lowest hole that holds the request, the free tail last
  mixed           first fit for requests of at most 1 MiB, best fit for larger ones

Usage: python3 bench/placement_model.py TRACE...   (for example the random_seedN.trace files of
`cargo bench -p gpumem-benches --bench gpu -- --write-seeds DIR`)
"""
import bisect
import statistics
import sys

MIB = 1 << 20
GRANULE = 2 * MIB
UNIT = 512
RULES = ("best-fit", "best-fit-tail", "first-fit", "mixed")


def read(path):
    steps = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "a":
                steps.append(("a", parts[1], int(parts[2])))
            elif parts and parts[0] == "f":
                steps.append(("f", parts[1]))
    return steps


def replay(steps, rule):
    """Peak held over peak in use."""
    starts, size_of, live = [], {}, {}
    mapped = used = peak = 0

    def give(at, n):
        i = bisect.bisect_left(starts, at)
        if i > 0 and starts[i - 1] + size_of[starts[i - 1]] == at:
            at = starts.pop(i - 1)
            n += size_of.pop(at)
            i -= 1
        if i < len(starts) and at + n == starts[i]:
            n += size_of.pop(starts.pop(i))
        starts.insert(i, at)
        size_of[at] = n

    for step in steps:
        if step[0] == "f":
            at, n, asked = live.pop(step[1])
            used -= asked
            give(at, n)
            continue
        n = -(-step[2] // UNIT) * UNIT
        used += step[2]
        peak = max(peak, used)
        tail = starts[-1] if starts and starts[-1] + size_of[starts[-1]] == mapped else None
        kept_apart = None if rule == "best-fit-tail" else tail
        holes = [s for s in starts if size_of[s] >= n and s != kept_apart]
        best = None
        if holes:
            if rule == "first-fit" or (rule == "mixed" and n <= MIB):
                best = holes[0]
            else:
                best = min(holes, key=lambda s: (size_of[s], s))
        if best is None and tail is not None and size_of[tail] >= n:
            best = tail
        if best is None:
            lacking = -(-(n - (size_of[tail] if tail is not None else 0)) // GRANULE) * GRANULE
            grow = lacking if n <= MIB else max(lacking, 20 * MIB, -(-(mapped // 64) // GRANULE) * GRANULE)
            if tail is None:
                give(mapped, grow)
                tail = mapped
            else:
                size_of[tail] += grow
            mapped += grow
            best = tail
        found = size_of.pop(best)
        starts.remove(best)
        if found > n:
            give(best + n, found - n)
        live[step[1]] = (best, n, step[2])
    return mapped / peak


def main(paths):
    traces = [(p, read(p)) for p in paths]
    for rule in RULES:
        ratios = [replay(steps, rule) for _, steps in traces]
        cells = " ".join(f"{r:.3f}" for r in ratios)
        print(f"{rule:<14} {cells}   mean {statistics.mean(ratios):.4f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
