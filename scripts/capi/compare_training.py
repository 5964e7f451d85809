#!/usr/bin/env python3
"""Compares the JSON results of scripts/capi/torch_train.py runs: the first is the reference
(PyTorch's allocator), the second a control (PyTorch's allocator again, another process), the
rest the runs to compare (gpumem's, or PyTorch's with other settings). Prints a Markdown table and writes it with a verdict to SUMMARY.json.

Exit status: 0 when every run's losses are bit-identical to the reference's; 2 when the control
differs (the setup is not deterministic, so nothing can be concluded about the allocator); 1 when
another run differs.

Usage: python3 scripts/capi/compare_training.py SUMMARY.json REF.json CONTROL.json GPUMEM.json...
"""
import json
import sys


def main(summary_path, ref_path, control_path, *others):
    runs = [json.load(open(p)) for p in (ref_path, control_path, *others)]
    ref = runs[0]
    rows = ["| run | losses equal to reference | peak reserved (MiB) | driver allocs | driver frees | "
            "median step (ms) | device used at end (MiB) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    verdicts = []
    for run in runs:
        equal = run["losses_hex"] == ref["losses_hex"]
        first_diff = next((i for i, (a, b) in enumerate(zip(run["losses_hex"], ref["losses_hex"])) if a != b), None)
        verdicts.append({"label": run["label"], "losses_identical": equal, "first_differing_step": first_diff})
        rows.append(f"| {run['label']} | {'yes' if equal else f'NO (step {first_diff})'} | "
                    f"{run['peak_reserved_bytes'] / 2**20:.1f} | {run['driver_allocs']} | {run['driver_frees']} | "
                    f"{run['median_step_s_after_first'] * 1e3:.2f} | {run['device_used_bytes_end'] / 2**20:.0f} |")
    table = "\n".join(rows)
    print(f"GPT-2 small, batch 8 x 512, {len(ref['losses'])} steps, {ref['device']}, torch {ref['torch']}, "
          f"attention {ref['attn']}")
    print(table)
    print("losses (reference):", " ".join(ref["losses_hex"]))
    control_ok = verdicts[1]["losses_identical"]
    gpumem_ok = all(v["losses_identical"] for v in verdicts[2:])
    status = 0 if control_ok and gpumem_ok else (2 if not control_ok else 1)
    with open(summary_path, "w") as f:
        json.dump({"table": table, "runs": verdicts, "status": status,
                   "reference_losses_hex": ref["losses_hex"]}, f, indent=1)
    if not control_ok:
        print("MISMATCH: PyTorch's allocator gave different losses in two processes: the setup is not "
              "deterministic", file=sys.stderr)
    elif not gpumem_ok:
        bad = [v["label"] for v in verdicts[2:] if not v["losses_identical"]]
        print(f"MISMATCH: losses with gpumem differ from PyTorch's allocator: {bad}", file=sys.stderr)
    else:
        print("training losses: bit-identical with gpumem and with PyTorch's allocator")
    return status


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
