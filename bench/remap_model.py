#!/usr/bin/env python3
"""Expandable segments that give back the pages under free holes: how far below its ratio the random
trace could go, and how many raw allocations that would take.

A model, not gpumem: one address range, physical memory mapped in pieces (each a raw allocation,
mapped whole, as the driver requires), requests rounded to 512 B, freed chunks merged with free
neighbours. A request is placed in the smallest free hole that is mapped throughout; when there is
none, every piece that lies wholly inside free space is unmapped and released (the hole keeps its
addresses), and the request goes where it needs the fewest new bytes mapped, the unmapped parts
mapped as new pieces of at most PIECE bytes (2 MiB granules). Nothing is given back otherwise.

Prints, for each trace: peak mapped over peak in use, raw allocations and raw frees, without and
with the release (pieces as large as the need, unless PIECE is set).

Usage: PIECE=$((8 << 20)) python3 bench/remap_model.py TRACE...   (the traces of
`cargo bench -p gpumem-benches --bench gpu -- --write-seeds DIR` or `--write-trace`; streams are ignored)
"""
import bisect
import os
import sys

from placement_model import read  # the same trace files

MIB = 1 << 20
GRANULE = 2 * MIB
UNIT = 512
END = 1 << 50
PIECE = int(os.environ.get("PIECE", str(1 << 40)))


def up(x, m):
    return -(-x // m) * m


class Range:
    def __init__(self):
        self.free, self.starts = {}, []  # free address intervals, merged
        self.pieces, self.pstarts = {}, []  # mapped physical allocations
        self.mapped = self.allocs = self.frees = 0
        self.give(0, END)

    def give(self, at, n):
        i = bisect.bisect_left(self.starts, at)
        if i > 0 and self.starts[i - 1] + self.free[self.starts[i - 1]] == at:
            at = self.starts.pop(i - 1)
            n += self.free.pop(at)
            i -= 1
        if i < len(self.starts) and at + n == self.starts[i]:
            n += self.free.pop(self.starts.pop(i))
        self.starts.insert(i, at)
        self.free[at] = n

    def take(self, at, n):
        i = bisect.bisect_right(self.starts, at) - 1
        h = self.starts.pop(i)
        hl = self.free.pop(h)
        if at > h:
            self.give(h, at - h)
        if at + n < h + hl:
            self.give(at + n, h + hl - at - n)

    def unmapped(self, a, b):
        """The granule-aligned runs of [a, b) no piece covers."""
        a, b = a // GRANULE * GRANULE, up(b, GRANULE)
        runs, cur = [], a
        i = max(bisect.bisect_right(self.pstarts, a) - 1, 0)
        while cur < b:
            while i < len(self.pstarts) and self.pstarts[i] + self.pieces[self.pstarts[i]] <= cur:
                i += 1
            if i < len(self.pstarts) and self.pstarts[i] <= cur:
                cur = self.pstarts[i] + self.pieces[self.pstarts[i]]
                continue
            end = min(self.pstarts[i] if i < len(self.pstarts) else b, b)
            runs.append((cur, end - cur))
            cur = end
        return runs

    def map(self, at, n):
        while n > 0:
            k = min(n, PIECE)
            bisect.insort(self.pstarts, at)
            self.pieces[at] = k
            self.mapped += k
            self.allocs += 1
            at, n = at + k, n - k

    def release_free_pieces(self):
        for p in list(self.pstarts):
            n = self.pieces[p]
            i = bisect.bisect_right(self.starts, p) - 1
            if i >= 0 and self.starts[i] + self.free[self.starts[i]] >= p + n:
                self.pstarts.remove(p)
                del self.pieces[p]
                self.mapped -= n
                self.frees += 1

    def lend(self, n, release):
        fits = [h for h in self.starts if self.free[h] >= n and not self.unmapped(h, h + n)]
        if fits:
            best = min(fits, key=lambda h: self.free[h])
            self.take(best, n)
            return best
        if release:
            self.release_free_pieces()
        best = None
        for h in self.starts:
            hl = self.free[h]
            if hl < n:
                continue
            for at in {h, max(h, (h + hl - n) // GRANULE * GRANULE) if h + hl < END else h}:
                if at + n > h + hl:
                    continue
                runs = self.unmapped(at, at + n)
                key = (sum(r[1] for r in runs), len(runs), hl)
                if best is None or key < best[0]:
                    best = (key, at, runs)
        _, at, runs = best
        for a, length in runs:
            self.map(a, length)
        self.take(at, n)
        return at


def replay(steps, release):
    r, live = Range(), {}
    used = peak = held = 0
    for step in steps:
        if step[0] == "f":
            at, n, asked = live.pop(step[1])
            used -= asked
            r.give(at, n)
            continue
        n = up(step[2], UNIT)
        used += step[2]
        peak = max(peak, used)
        live[step[1]] = (r.lend(n, release), n, step[2])
        held = max(held, r.mapped)
    return held / peak, r.allocs, r.frees


def main(paths):
    for path in paths:
        steps = read(path)
        cells = ["%.3f held / in use, %d raw allocations, %d frees" % replay(steps, rel) for rel in (False, True)]
        print(f"{os.path.basename(path)}: kept {cells[0]}; released {cells[1]}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
