#!/usr/bin/env python3
"""Records the allocation trace of a few training steps with PyTorch's memory history, in the text
format gpumem's benchmark replays (`a <id> <size> <stream>` / `f <id>`, and a `# step N` line
where each training step begins).

Two models, each built from its configuration (nothing is downloaded), recorded from before the
model is created:

- gpt2: GPT-2 small (124 M parameters) language-model training, batch 8 x 512 tokens, AdamW;
- bert: BERT-base (110 M parameters) fine-tuning for sequence classification (2 labels), batch
  32 x 128 tokens, AdamW, with dropout on, as fine-tuning runs.

Steps are marked in the recording by allocating and freeing a tensor of a size nothing else uses;
the marks become the `# step` lines and are not part of the trace.

Usage: python3 bench/record_training_trace.py [gpt2|bert] OUT.trace [STEPS]
       (the model defaults to gpt2, the steps to 3)
"""
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

# The marker's size in bytes: a multiple of PyTorch's 512-byte rounding that no model tensor has.
MARK = 1_234_567 * 512


def gpt2():
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    tokens = torch.randint(0, model.config.vocab_size, (8, 512), device="cuda")
    return model, lambda: model(tokens, labels=tokens).loss


def bert():
    model = BertForSequenceClassification(BertConfig(num_labels=2)).cuda()
    model.train()
    tokens = torch.randint(0, model.config.vocab_size, (32, 128), device="cuda")
    mask = torch.ones_like(tokens)
    labels = torch.randint(0, 2, (32,), device="cuda")
    return model, lambda: model(input_ids=tokens, attention_mask=mask, labels=labels).loss


def mark():
    m = torch.empty(MARK, dtype=torch.uint8, device="cuda")
    del m


def main(which, path, steps):
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000)
    model, loss_of = {"gpt2": gpt2, "bert": bert}[which]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        mark()
        loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)

    streams, live, lines, next_id, step = {}, {}, [], 0, 0
    marks = set()
    for event in snapshot["device_traces"][0]:
        action, addr = event["action"], event["addr"]
        if action == "alloc" and event["size"] == MARK:
            step += 1
            lines.append(f"# step {step}")
            marks.add(addr)
        elif action == "alloc":
            stream = streams.setdefault(event.get("stream", 0), len(streams))
            live[addr] = next_id
            lines.append(f"a {next_id} {event['size']} {stream}")
            next_id += 1
        elif action == "free_requested" and addr in marks:
            marks.discard(addr)
        elif action == "free_requested" and addr in live:
            lines.append(f"f {live.pop(addr)}")
    if step != steps:
        sys.exit(f"found {step} step marks, expected {steps}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(
        f"{which} training trace: {len(lines) - steps} steps of the trace, {next_id} allocations, "
        f"{steps} training steps, {len(streams)} stream(s) -> {path}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    which = args.pop(0) if args and args[0] in ("gpt2", "bert") else "gpt2"
    if not args:
        sys.exit(__doc__)
    main(which, args[0], int(args[1]) if len(args) > 1 else 3)
