#!/usr/bin/env python3
"""Real PyTorch programs under one allocator each, for the memory table of BENCHMARKS.md.

Four programs, every model built from its configuration (nothing downloaded):
- cnn:  ResNet-50 training, fp32, batch 64 of 224x224, SGD with momentum;
- vit:  ViT-B/16 training under bf16 autocast, batch 64, AdamW;
- bert: a BERT-base fine-tune (sequence classification), batch 32, each batch padded to its own
        length (dynamic padding: lengths drawn from 64..512), AdamW;
- gen:  GPT-2 small `generate()` (greedy, fp16) over varied batch sizes, prompt lengths and output
        lengths, for several seeds.

One allocator per process (PyTorch cannot swap its allocator once it has allocated):
`--allocator torch` is PyTorch's own (with or without PYTORCH_CUDA_ALLOC_CONF set outside),
`--allocator gpumem --lib libgpumem_capi.so [--growth-policy NAME]` is gpumem's pool through its C
ABI (torch.cuda.memory.CUDAPluggableAllocator, via scripts/capi/gpumem_alloc.py); no policy named means
the ABI's default.

Appends one JSON line to --out: peak bytes held from the device (PyTorch: max_memory_reserved;
gpumem: its peak of bytes held), peak bytes in use (PyTorch only: a pluggable allocator has no
such counter; the program is the same under every allocator, so the table takes PyTorch's
default run's figure), driver calls (PyTorch: num_device_alloc + num_device_free, which count the
maps and unmaps of expandable segments; gpumem: raw allocations and frees, growths and shrinks
included), the step times, and each step's loss (or the generated tokens' checksum) as exact hex,
to compare the allocators' results; and per step (the peaks reset after each): peak held, peak in
use, driver calls and, for gpumem, the planner's state, from which the table's second part takes
the steady loop's figures.

Usage: python3 bench/pytorch_programs.py PROGRAM --allocator torch|gpumem [--lib LIB]
       [--growth-policy NAME] [--step | --plan-automatically] [--record TRACE] --label LABEL
       --out RESULTS.jsonl
       python3 bench/pytorch_programs.py --table RESULTS.jsonl
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "capi"))


def seeded(torch, seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def vision_training(torch, steps, model, opt, dtype):
    """Training steps of an image classifier on one batch of 64 224x224 images, under autocast to
    `dtype` (None: fp32)."""
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield loss


def cnn(torch, steps):
    import torchvision
    model = torchvision.models.resnet50(weights=None, num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return vision_training(torch, steps, model, opt, None)


def vit(torch, steps):
    import torchvision
    model = torchvision.models.vit_b_16(weights=None).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return vision_training(torch, steps, model, opt, torch.bfloat16)


def bert(torch, steps):
    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(num_labels=4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    lengths = torch.randint(8, 65, (steps,), generator=torch.Generator().manual_seed(1)) * 8
    for length in lengths.tolist():
        ids = torch.randint(1000, 30000, (32, length), device="cuda")
        labels = torch.randint(0, 4, (32,), device="cuda")
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield loss


def gen(torch, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    for seed in range(3):
        rng = torch.Generator().manual_seed(100 + seed)
        for _ in range(steps):
            batch = [1, 2, 4, 8, 16, 32][torch.randint(0, 6, (1,), generator=rng).item()]
            prompt = torch.randint(16, 385, (1,), generator=rng).item()
            new = torch.randint(8, 97, (1,), generator=rng).item()
            ids = torch.randint(0, 50257, (batch, prompt), generator=rng).cuda()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=0)
            yield out.sum().double()


# Training loops run long enough for a plan to be learned (two matching iterations after the first
# step mark; found from the allocations, a few more) and served for several iterations.
PROGRAMS = {"cnn": (cnn, 16), "vit": (vit, 16), "bert": (bert, 16), "gen": (gen, 4)}
#: The steps the steady loop's figures are taken over (the table's second part).
STEADY = 4


def run(args):
    gpumem_alloc = None
    if args.allocator == "gpumem":
        import gpumem_alloc  # noqa: F811
        gpumem_alloc.use_in_pytorch(args.lib, growth_policy=args.growth_policy)
        if args.plan_automatically:
            gpumem_alloc.plan_automatically()
        if args.record:
            gpumem_alloc.recorder_start(args.record)
    # With --record: each step's end, in nanoseconds from the recording's start (as its lines'
    # time_ns, to within the call's time), to read the recording step by step.
    record_start, step_end_ns = time.perf_counter(), []
    import torch
    seeded(torch, 0)
    torch.backends.cudnn.benchmark = False
    program, steps = PROGRAMS[args.program]
    results, times = [], []
    # Each step's peak held and in use (peaks reset after each), its raw calls, and the planner's
    # state at its end: the steady loop's figures are the last steps'.
    step_held, step_in_use, step_calls, step_states, step_driver_ns = [], [], [], [], []
    # The device's own count of memory in use at each step's end (cuMemGetInfo: every process's
    # memory and this one's context too): it includes what the driver rounds each allocation up
    # to, which neither allocator's count of held bytes does.
    step_device_used = []

    def raw_calls_now():
        if gpumem_alloc is None:
            s = torch.cuda.memory_stats()
            return s.get("num_device_alloc", 0) + s.get("num_device_free", 0)
        s = gpumem_alloc.stats()
        return s["n_raw_allocs"] + s["n_raw_frees"]

    calls_before = raw_calls_now()
    it = program(torch, args.steps or steps)
    while True:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            value = next(it)
        except StopIteration:
            break
        value = value.item()
        if args.step:
            gpumem_alloc.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        step_end_ns.append(int((time.perf_counter() - record_start) * 1e9))
        results.append(float(value).hex())
        if gpumem_alloc is None:
            step_held.append(torch.cuda.max_memory_reserved())
            step_in_use.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        else:
            m = gpumem_alloc.memory_stats()
            step_held.append(m["reserved_bytes.all.peak"])
            step_in_use.append(m["allocated_bytes.all.peak"])
            step_driver_ns.append(m["gpumem.driver_ns"] - sum(step_driver_ns))
            step_states.append(gpumem_alloc.plan_state())
            gpumem_alloc.reset_peak_stats()
        free, total = torch.cuda.mem_get_info()
        step_device_used.append(total - free)
        calls_now = raw_calls_now()
        step_calls.append(calls_now - calls_before)
        calls_before = calls_now
    if args.record:
        gpumem_alloc.recorder_stop()
    row = {
        "program": args.program, "label": args.label, "allocator": args.allocator,
        "growth_policy": args.growth_policy or ("default" if gpumem_alloc else None),
        "planned": bool(args.step),
        "planned_automatically": bool(args.plan_automatically),
        "step_peak_held": step_held, "step_peak_in_use": step_in_use, "step_raw_calls": step_calls,
        "step_plan_states": step_states, "step_driver_ns": step_driver_ns,
        "step_device_used": step_device_used,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "results_hex": results, "step_times_s": times,
        **({"record": args.record, "step_end_ns": step_end_ns} if args.record else {}),
        # The first steps include cuDNN/cuBLAS set-up and the allocator's growth.
        "median_step_s": statistics.median(times[2:] if len(times) > 3 else times),
        "total_s": sum(times),
    }
    if gpumem_alloc is None:
        s = torch.cuda.memory_stats()
        # The peaks were reset after each step: the run's are the steps' largest.
        row.update(peak_held=max(step_held), peak_in_use=max(step_in_use),
                   raw_calls=s.get("num_device_alloc", 0) + s.get("num_device_free", 0))
    else:
        s = gpumem_alloc.stats()
        if args.step or args.plan_automatically:
            row["plan_state"] = gpumem_alloc.plan_state()
        # gpumem's own peak in use is of rounded sizes: PyTorch's run gives the reference.
        row.update(peak_held=max(step_held), peak_in_use=None,
                   raw_calls=s["n_raw_allocs"] + s["n_raw_frees"], gpumem_stats=s)
        if s["n_failed_mallocs"] + s["n_failed_frees"] + s["n_failed_other"]:
            row["failed_calls"] = True
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{args.program} {args.label}: peak held {row['peak_held'] / 1e9:.3f} GB, raw calls "
          f"{row['raw_calls']}, median step {row['median_step_s'] * 1e3:.1f} ms, total {row['total_s']:.2f} s")


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    out = ["| program | in use (PyTorch) | " + " | ".join(labels) + " |", "| --- | --- |" + " --- |" * len(labels)]
    for program in PROGRAMS:
        runs = {r["label"]: r for r in rows if r["program"] == program}
        ref = runs.get(labels[0])
        if not ref:
            continue
        in_use = ref["peak_in_use"]
        cells = []
        for label in labels:
            r = runs.get(label)
            if r is None:
                cells.append("-")
                continue
            same = "same results" if r["results_hex"] == ref["results_hex"] else "RESULTS DIFFER"
            driver = f", {sum(r['step_driver_ns']) / 1e6:.1f} ms in driver" if r.get("step_driver_ns") else ""
            cells.append(f"{r['peak_held'] / 1e9:.2f} GB ({r['peak_held'] / in_use:.3f}), {r['raw_calls']} raw{driver}, "
                         f"{r['median_step_s'] * 1e3:.1f} ms/step ({r['median_step_s'] / ref['median_step_s']:.3f}), "
                         f"{same}")
        out.append(f"| {program} | {in_use / 1e9:.2f} GB | " + " | ".join(cells) + " |")
    # The steady loop: the last STEADY steps of each run, held over PyTorch's in use in them.
    out += ["", f"Last {STEADY} steps: peak held over PyTorch's peak in use in them, raw calls in them, the "
            "device's memory in use at their ends (cuMemGetInfo)", "",
            "| program | in use (PyTorch) | " + " | ".join(labels) + " |", "| --- | --- |" + " --- |" * len(labels)]
    for program in PROGRAMS:
        runs = {r["label"]: r for r in rows if r["program"] == program}
        ref = runs.get(labels[0])
        if not ref or not ref.get("step_peak_in_use"):
            continue
        in_use = max(ref["step_peak_in_use"][-STEADY:])
        cells = []
        for label in labels:
            r = runs.get(label)
            if r is None or not r.get("step_peak_held"):
                cells.append("-")
                continue
            held = max(r["step_peak_held"][-STEADY:])
            states = r.get("step_plan_states") or []
            planned = " planned" if states and all(x == 2 for x in states[-STEADY:]) else ""
            driver = (f", {sum(r['step_driver_ns'][-STEADY:]) / 1e6:.2f} ms in driver"
                      if r.get("step_driver_ns") else "")
            device = (f", device {max(r['step_device_used'][-STEADY:]) / 1e9:.3f} GB"
                      if r.get("step_device_used") else "")
            cells.append(f"{held / 1e9:.3f} GB ({held / in_use:.3f}), {sum(r['step_raw_calls'][-STEADY:])} raw"
                         f"{driver}{device}{planned}")
        out.append(f"| {program} | {in_use / 1e9:.3f} GB | " + " | ".join(cells) + " |")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program", nargs="?", choices=sorted(PROGRAMS))
    ap.add_argument("--allocator", choices=["torch", "gpumem"])
    ap.add_argument("--lib", default=os.environ.get("GPUMEM_CAPI_LIB"))
    ap.add_argument("--growth-policy", default=None)
    ap.add_argument("--step", action="store_true",
                    help="gpumem only: mark each iteration's end (gpumem_step), so the loop is planned")
    ap.add_argument("--plan-automatically", action="store_true",
                    help="gpumem only: let the pool find the loop's iterations (gpumem_plan_automatically)")
    ap.add_argument("--record", metavar="TRACE",
                    help="gpumem only: record every allocation, free, raw call and iteration boundary "
                         "into TRACE (gpumem-trace's format)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--label")
    ap.add_argument("--out")
    ap.add_argument("--table")
    args = ap.parse_args()
    if args.table:
        return table(args.table)
    if not (args.program and args.allocator and args.label and args.out):
        sys.exit(__doc__)
    run(args)


if __name__ == "__main__":
    main()
