#!/usr/bin/env python3
"""Records the allocation trace of three training steps of a GPT-2-sized model with PyTorch's memory
history, in the text format gpumem's benchmark replays (`a <id> <size> <stream>` / `f <id>`).

The model is built from its configuration (GPT-2 small: 124 M parameters), so nothing is downloaded.
Batch 8 x 512 tokens, AdamW, three steps, recording from before the model is created.

Usage: python3 bench/record_training_trace.py OUT.trace
"""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main(path):
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
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

    streams, live, lines, next_id = {}, {}, [], 0
    for event in snapshot["device_traces"][0]:
        action = event["action"]
        if action == "alloc":
            stream = streams.setdefault(event.get("stream", 0), len(streams))
            live[event["addr"]] = next_id
            lines.append(f"a {next_id} {event['size']} {stream}")
            next_id += 1
        elif action == "free_requested" and event["addr"] in live:
            lines.append(f"f {live.pop(event['addr'])}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"training trace: {len(lines)} steps, {next_id} allocations, {len(streams)} stream(s) -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
