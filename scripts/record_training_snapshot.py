#!/usr/bin/env python3
"""Records PyTorch's memory snapshot (with its history) of three training steps of a GPT-2-sized
model, the run bench/record_training_trace.py records as a text trace: GPT-2 small built from its
configuration (nothing downloaded), batch 8 x 512 tokens, AdamW, recording from before the model
is created. Writes, into OUT_DIR:

  training_snapshot.pickle        torch.cuda.memory._snapshot(), pickled
  training_snapshot.stats.json    torch.cuda.memory_stats() of the run
  training_memory_summary.txt     torch.cuda.memory_summary() of the run

Usage: python3 scripts/record_training_snapshot.py OUT_DIR
"""
import json
import os
import pickle
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=2_000_000)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (8, 512), device="cuda")
    for _ in range(3):
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(os.path.join(out_dir, "training_snapshot.pickle"), "wb") as f:
        pickle.dump(snapshot, f)
    stats = dict(torch.cuda.memory_stats())
    stats["torch_version"] = torch.__version__
    stats["device"] = torch.cuda.get_device_name()
    stats["trace_entries"] = sum(len(t) for t in snapshot["device_traces"])
    with open(os.path.join(out_dir, "training_snapshot.stats.json"), "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "training_memory_summary.txt"), "w") as f:
        f.write(torch.cuda.memory_summary())
    print(f"training snapshot: {stats['trace_entries']} entries; requested peak "
          f"{stats['requested_bytes.all.peak']}, reserved peak {stats['reserved_bytes.all.peak']}")


if __name__ == "__main__":
    main(sys.argv[1])
