#!/usr/bin/env python3
"""BENCHMARKS.md's memory table from one run of bench/memory-table.sh: every workload under PyTorch's
default, PyTorch's expandable_segments:True, gpumem's C ABI default and gpumem with stitching, with
peak held, peak in use, held over in use, the waste (held less in use) over PyTorch expandable
segments', raw calls, time in the driver and step (or replay) time over PyTorch's default's; then
the programs once a plan learned with no step call is in force (fixed blocks, stitching), beside the others
over the same steps, with the device's own count of memory in use.

Reads OUT/programs/results.jsonl (the programs through the C ABI), OUT/replays/table.md (the traces
replayed on the device, gpumem's rows and its anchors'), OUT/replays/in_use.json (each trace's peak
in use) and OUT/replays/sweep/{gpumem,anchors}.txt (the random trace over seeds 1 to 50).

Usage: python3 bench/memory_table.py OUT
"""
import json
import os
import re
import sys

PROGRAMS = {
    "cnn": "ResNet-50 training",
    "vit": "ViT-B/16 training, bf16",
    "bert": "BERT fine-tune",
    "gen": "GPT-2 `generate()`",
}
# (label in results.jsonl, label in the table's replays, column name)
ALLOCATORS = [
    ("PyTorch default", "PyTorch caching allocator, default", "PyTorch default"),
    ("PyTorch expandable", "PyTorch, expandable_segments:True", "PyTorch `expandable_segments:True`"),
    ("gpumem C ABI default", "gpumem, Segments, expandable segments", "gpumem, the C ABI's default"),
    ("gpumem default, stitching", "gpumem, Segments, stitching", "gpumem + stitching (`GPUMEM_STITCH=1`)"),
]
TRACES = {
    "training": "GPT-2 training trace (replayed)",
    "bert": "BERT fine-tuning trace (replayed)",
    "random": "random trace, 4 streams (replayed)",
    "random one stream": "random trace, one stream (replayed)",
}
HEADER = (
    "| workload | allocator | peak held | peak in use | held / in use | waste over expandable's "
    "| raw calls | time in the driver | time over PyTorch default's |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def gb(n):
    return f"{n / 1e9:.3f} GB"


def missing(workload, column):
    """The row of an allocator the run has no figures for."""
    return f"| {workload} | {column} | - | - | - | - | - | - | - |"


def program_rows(path):
    """The programs: PyTorch's runs with their own peak in use; gpumem's over PyTorch expandable
    segments' (its own count is of rounded sizes, see bench/pytorch_programs.py)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for program, name in PROGRAMS.items():
        runs = {r["label"]: r for r in rows if r["program"] == program}
        if not runs:
            continue
        expandable = runs.get("PyTorch expandable")
        default = runs.get("PyTorch default")
        reference = (expandable or default or {}).get("peak_in_use")
        exp_waste = expandable["peak_held"] - expandable["peak_in_use"] if expandable else None
        for label, _, column in ALLOCATORS:
            r = runs.get(label)
            if r is None or not (r["peak_in_use"] or reference):
                yield missing(name, column)
                continue
            held = r["peak_held"]
            in_use = r["peak_in_use"] or reference
            mark = "" if r["peak_in_use"] else " (PyTorch's)"
            waste = f"{(held - in_use) / exp_waste:.2f}x" if exp_waste else "-"
            driver = f"{sum(r['step_driver_ns']) / 1e6:.1f} ms" if r.get("step_driver_ns") else "not reported"
            step = f"{r['median_step_s'] / default['median_step_s']:.3f}x per step" if default else "-"
            yield (
                f"| {name} | {column} | {gb(held)} | {gb(in_use)}{mark} | {held / in_use:.3f} | {waste} "
                f"| {r['raw_calls']} | {driver} | {step} |"
            )


PLANNED = [
    ("gpumem fixed blocks, planned automatically", "gpumem, fixed blocks, planned automatically"),
    ("gpumem stitching, planned automatically", "gpumem + stitching, planned automatically"),
]
PLANNED_HEADER = (
    "| workload | allocator | steps | peak held | held / PyTorch's in use | waste over expandable's "
    "| raw calls | time in the driver | device's memory in use | step time over PyTorch default's |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def planned_steps(run):
    """The steps once the plan is in force, if it stayed in force to the end (else None): those
    after the first step it served whole, whose end gives back the recorded iterations' blocks
    (the pool's iterations need not begin where the program's steps do)."""
    states = run.get("step_plan_states") or []
    first = next((i for i, s in enumerate(states) if all(x == 2 for x in states[i:])), None)
    if first is None or first + 2 >= len(states):
        return None
    return range(first + 2, len(states))


def planned_rows(path):
    """The programs once a plan learned with no step call is in force: the steps it served, beside
    PyTorch's two modes and the C ABI's default over the same steps. Held is each allocator's own
    count (for fixed blocks, the bytes asked of cuMemAlloc, which the driver backs with whole
    pages); the device's memory in use (cuMemGetInfo, every allocation rounded as the driver
    rounds it, and the context) is the count all four share."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for program, name in PROGRAMS.items():
        runs = {r["label"]: r for r in rows if r["program"] == program}
        planned = [(label, column) for label, column in PLANNED if label in runs]
        if not planned:
            continue
        # The steps both plans served (each stayed in force to the end, or the row says not).
        spans = [(column, planned_steps(runs[label])) for label, column in planned]
        for column, span in spans:
            if span is None:
                yield f"| {name} | {column} | no plan in force | - | - | - | - | - | - | - |"
        spans = [span for _, span in spans if span is not None]
        if not spans:
            continue
        steps = range(max(s.start for s in spans), min(s.stop for s in spans))
        default = runs.get("PyTorch default")
        expandable = runs.get("PyTorch expandable")
        reference = expandable or default
        in_use = max(reference["step_peak_in_use"][i] for i in steps) if reference else None
        exp_waste = (max(expandable["step_peak_held"][i] for i in steps) - in_use) if expandable else None
        for label, column in [(a[0], a[2]) for a in ALLOCATORS[:3]] + planned:
            r = runs.get(label)
            if r is None or not in_use:
                continue
            held = max(r["step_peak_held"][i] for i in steps)
            waste = f"{(held - in_use) / exp_waste:.2f}x" if exp_waste else "-"
            calls = sum(r["step_raw_calls"][i] for i in steps)
            driver = (f"{sum(r['step_driver_ns'][i] for i in steps) / 1e6:.1f} ms"
                      if r.get("step_driver_ns") else "not reported")
            device = gb(max(r["step_device_used"][i] for i in steps)) if r.get("step_device_used") else "-"
            step = "-"
            if default:
                mine = sum(r["step_times_s"][i] for i in steps)
                step = f"{mine / sum(default['step_times_s'][i] for i in steps):.3f}x"
            yield (
                f"| {name} | {column} | {steps.start + 1} to {steps.stop} | {gb(held)} | {held / in_use:.3f} "
                f"| {waste} | {calls} | {driver} | {device} | {step} |"
            )


def replay_rows(directory):
    """The device replays: gpumem's rows and its anchors' from the benchmark's table."""
    in_use = json.load(open(os.path.join(directory, "in_use.json")))
    cells = {}
    for line in open(os.path.join(directory, "table.md")):
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) != 9 or parts[0] in ("trace", "---"):
            continue
        trace = re.sub(r" \(\d+ steps\)$", "", parts[0])
        cells[(trace, parts[1])] = parts[2:]
    for trace, name in TRACES.items():
        use = in_use.get(trace.replace(" ", "_"))
        if use is None:
            continue
        expandable = cells.get((trace, ALLOCATORS[1][1]))
        exp = float(expandable[0]) if expandable and expandable[0] != "-" else None
        default_ms = cells.get((trace, ALLOCATORS[0][1]), [None] * 7)[5]
        for _, who, column in ALLOCATORS:
            c = cells.get((trace, who))
            if c is None or c[0] == "-":
                yield missing(name, column)
                continue
            r = float(c[0])
            waste = f"{(r - 1) / (exp - 1):.2f}x" if exp and exp > 1 else "-"
            calls = int(c[1]) + int(c[2]) if c[1] != "-" and c[2] != "-" else "-"
            ms = float(c[5].split()[0]) if c[5] != "-" else None
            over = f"{ms / float(default_ms.split()[0]):.2f}x the replay" if ms and default_ms not in (None, "-") else "-"
            yield (
                f"| {name} | {column} | {gb(r * use)} | {gb(use)} | {r:.3f} | {waste} | {calls} | {c[6]} | {over} |"
            )


def sweep_rows(directory):
    """The random trace on one stream over seeds 1 to 50: medians."""
    medians = {}
    for f in ("gpumem.txt", "anchors.txt"):
        path = os.path.join(directory, f)
        if not os.path.exists(path):
            continue
        for line in open(path):
            m = re.match(r"(.+?)\s+mean (\S+)\s+median (\S+).*raw allocations\s+(\S+)", line)
            if m:
                medians[m.group(1).strip()] = (float(m.group(3)), float(m.group(4)))
    exp = medians.get(ALLOCATORS[1][1])
    for _, who, column in ALLOCATORS:
        v = medians.get(who)
        if v is None:
            yield missing("random trace, one stream, median of seeds 1 to 50", column)
            continue
        waste = f"{(v[0] - 1) / (exp[0] - 1):.2f}x" if exp and exp[0] > 1 else "-"
        yield (
            f"| random trace, one stream, median of seeds 1 to 50 | {column} | - | - | {v[0]:.4f} | {waste} "
            f"| {v[1]:.1f} allocations (mean) | - | - |"
        )


def main(out):
    print(HEADER)
    programs = os.path.join(out, "programs", "results.jsonl")
    if os.path.exists(programs):
        for row in program_rows(programs):
            print(row)
        print("\nOnce a plan learned with no step call is in force (the steps it served):\n")
        print(PLANNED_HEADER)
        for row in planned_rows(programs):
            print(row)
    replays = os.path.join(out, "replays")
    if os.path.exists(os.path.join(replays, "table.md")):
        for row in replay_rows(replays):
            print(row)
    if os.path.isdir(os.path.join(replays, "sweep")):
        for row in sweep_rows(os.path.join(replays, "sweep")):
            print(row)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
