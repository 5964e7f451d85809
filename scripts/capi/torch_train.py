#!/usr/bin/env python3
"""GPT-2 training steps with PyTorch's own CUDA allocator or with gpumem's pool installed through
its C ABI; one allocator per process (PyTorch cannot swap an allocator once it is used).

The model, batch and optimiser are bench/record_training_trace.py's: GPT-2 small built from its
configuration (nothing downloaded), batch 8 x 512 tokens, AdamW (lr 1e-4). Deterministic settings
(seed 0, torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, no TF32, eager attention by
default, whose backward has no atomics) make the per-step losses a function of the program alone,
so two allocators must give bit-identical losses.

Prints one line per step and writes a JSON summary: the losses (exact, as float.hex), each step's
time, the peak memory the allocator held from the device (PyTorch: max_memory_reserved; gpumem: its
peak of bytes held), its driver calls (PyTorch: num_device_alloc/free; gpumem: raw allocations and
frees) and the device memory in use at the end (cudaMemGetInfo).

Usage: python3 scripts/capi/torch_train.py --allocator torch|gpumem [--lib libgpumem_capi.so]
       [--steps 10] [--growth-policy NAME] [--attn eager|sdpa] --out RESULT.json
"""
import argparse
import json
import os
import statistics
import sys
import time

# Read by cuBLAS when it initialises: set before torch touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build_model(attn):
    config = GPT2Config()
    try:
        return GPT2LMHeadModel._from_config(config, attn_implementation=attn)
    except (TypeError, AttributeError):
        config._attn_implementation = attn
        return GPT2LMHeadModel(config)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocator", choices=["torch", "gpumem"], required=True)
    ap.add_argument("--lib", default=os.environ.get("GPUMEM_CAPI_LIB"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--growth-policy", default=None)
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    gpumem_alloc = None
    if args.allocator == "gpumem":
        if not args.lib:
            sys.exit("torch_train.py: --lib (or GPUMEM_CAPI_LIB) is required with --allocator gpumem")
        import gpumem_alloc  # noqa: F811
        gpumem_alloc.use_in_pytorch(args.lib, growth_policy=args.growth_policy)
        print(f"gpumem {gpumem_alloc.version()} installed as PyTorch's allocator "
              f"(growth policy {gpumem_alloc.get_growth_policy()})")

    torch.manual_seed(0)
    # warn_only: an op without a deterministic kernel warns (in the log) instead of stopping the
    # run; the second run with PyTorch's allocator then shows whether the setup is deterministic.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = build_model(args.attn).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (8, 512), device="cuda")
    losses, times = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]!r} ({losses[-1].hex()}), {times[-1] * 1e3:.1f} ms", flush=True)

    free, total = torch.cuda.mem_get_info()
    result = {
        "label": args.label or args.allocator,
        "allocator": args.allocator,
        "growth_policy": args.growth_policy,
        "attn": args.attn,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "losses": losses,
        "losses_hex": [x.hex() for x in losses],
        "step_times_s": times,
        # The first step includes cuBLAS and kernel initialisation and the allocator's growth.
        "median_step_s_after_first": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "device_used_bytes_end": total - free,
    }
    ok = True
    if gpumem_alloc is None:
        stats = torch.cuda.memory_stats()
        result.update({
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "driver_allocs": stats.get("num_device_alloc"),
            "driver_frees": stats.get("num_device_free"),
        })
    else:
        s = gpumem_alloc.stats()
        result.update({
            "peak_reserved_bytes": s["peak_held_bytes"],
            "reserved_bytes_end": s["total_bytes"],
            "driver_allocs": s["n_raw_allocs"],
            "driver_frees": s["n_raw_frees"],
            "gpumem_stats": s,
        })
        failures = s["n_failed_mallocs"] + s["n_failed_frees"] + s["n_failed_other"]
        if failures:
            print(f"torch_train.py: gpumem reported {failures} failed call(s): {s}", file=sys.stderr)
            ok = False
        if s["n_mallocs"] == 0:
            print("torch_train.py: gpumem allocated nothing: the allocator was not installed", file=sys.stderr)
            ok = False
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"peak reserved {result['peak_reserved_bytes'] / 2**20:.1f} MiB, driver allocs "
          f"{result['driver_allocs']}, frees {result['driver_frees']}, median step "
          f"{result['median_step_s_after_first'] * 1e3:.1f} ms -> {args.out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
