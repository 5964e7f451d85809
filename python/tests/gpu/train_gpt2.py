"""GPT-2 training steps from a config (no downloads), with PyTorch's allocator or gpumem's, the
losses written as exact hex floats for a bit-for-bit comparison between two processes.

    python train_gpt2.py --allocator gpumem --out gpumem.json [--record trace.jsonl]
"""
import argparse
import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["torch", "gpumem"], required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", help="with gpumem: record every allocation into this trace")
    ap.add_argument("--snapshot", help="with gpumem: export the final snapshot here")
    args = ap.parse_args()

    gpumem = None
    if args.allocator == "gpumem":
        import gpumem_runtime.torch as gpumem
        gpumem.enable(policy="hold_peak_in_use")
        assert gpumem.is_enabled()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=256, vocab_size=8192,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, config.vocab_size, (8, 256), generator=generator) for _ in range(args.steps)]

    recording = gpumem.Recording(args.record) if (gpumem and args.record) else None
    if recording:
        recording.__enter__()
    losses = []
    for batch in batches:
        batch = batch.cuda()
        loss = model(batch, labels=batch).loss
        loss.backward()  # autograd's device thread allocates here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    torch.cuda.synchronize()
    result = {"allocator": args.allocator, "losses": [x.hex() for x in losses]}
    if recording:
        recording.__exit__(None, None, None)
        result["recorded_lines"] = recording.lines
        threads = {json.loads(line)["thread"] for line in open(args.record)}
        result["recorded_threads"] = len(threads)
    if gpumem:
        stats = gpumem.memory_stats()
        result["stats"] = {k: stats[k] for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak",
                                                  "allocation.all.allocated", "num_ooms")}
        if args.snapshot:
            gpumem.export_snapshot(args.snapshot)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    main()
