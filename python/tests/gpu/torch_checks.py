"""gpumem under PyTorch, from the installed wheel: the error before/after CUDA starts, an
allocation past the limit as torch.OutOfMemoryError (and the program goes on), record_stream
honoured (a control run without it shows the test can see reuse), statistics, and a snapshot that
torch.cuda._memory_viz turns into pages. Prints "ok"/"FAIL" lines; exits 1 on any failure.

    python torch_checks.py OUTDIR
"""
import base64
import os
import pickle
import re
import sys

import torch

import gpumem_runtime
import gpumem_runtime.torch as gpumem
from checks import check, finish

out = sys.argv[1]


check("no repository on sys.path", not any(os.path.isdir(os.path.join(p, "python", "gpumem_runtime")) for p in sys.path if p),
      gpumem_runtime.__file__)
check("the CUDA wheel", gpumem_runtime.backend() == "cuda", gpumem_runtime.backend())

LIMIT = 2 << 30
seen = []
gpumem.enable(limit=LIMIT, device=0)
gpumem.add_oom_observer(lambda device, message: seen.append(message), 0)
check("limit set", gpumem_runtime.get_limit(0) == LIMIT)
try:
    gpumem.enable()
    check("a second enable() raises", False)
except gpumem_runtime.GpumemError as e:
    check("a second enable() raises", "already" in str(e), str(e))

# Out of memory at the allocating call, then the program goes on.
a = torch.ones(1 << 20, device="cuda")
try:
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    check("allocation past the limit raises torch.OutOfMemoryError", False, "no exception")
except torch.OutOfMemoryError as e:
    check("allocation past the limit raises torch.OutOfMemoryError", "Out of memory" in str(e), str(e)[:200])
check("the OOM observer ran", len(seen) == 1, str(seen)[:200])
b = (a * 2).sum().item()
check("the program goes on after the OOM", b == 2 * (1 << 20), str(b))
check("num_ooms counted", gpumem.memory_stats()["num_ooms"] >= 1)


def reuse_race(record):
    """x is allocated on the current stream, written by a side stream after a long sleep, then
    freed; y of the same size is allocated and written at once on the current stream. Returns
    (same address, y corrupted by the side stream's late write)."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    n = 1 << 22
    x = torch.zeros(n, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles
        x.fill_(1.0)
    if record:
        x.record_stream(side)
    x_ptr = x.data_ptr()
    del x
    y = torch.empty(n, device="cuda")
    y.fill_(2.0)
    torch.cuda.synchronize()
    return y.data_ptr() == x_ptr, bool((y != 2.0).any().item())


same, corrupted = reuse_race(record=False)
check("control: without record_stream the memory is reused under the side stream's write",
      same and corrupted, f"same address {same}, corrupted {corrupted}")
same, corrupted = reuse_race(record=True)
check("record_stream: no reuse before the side stream's work completes", not corrupted,
      f"same address {same}, corrupted {corrupted}")

# Statistics, summary, peak reset.
stats = gpumem.memory_stats()
check("memory_stats has PyTorch's keys", stats["allocated_bytes.all.current"] >= 4 << 20 and "reserved_bytes.all.peak" in stats)
check("memory_summary", "gpumem memory summary" in gpumem.memory_summary())
gpumem.reset_peak_memory_stats()
stats = gpumem.memory_stats()
check("reset_peak_memory_stats", stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"])

# The snapshot in PyTorch's viewer.
path = os.path.join(out, "torch-snapshot.pickle")
gpumem.export_snapshot(path)
with open(path, "rb") as f:
    snap = pickle.load(f)
from torch.cuda import _memory_viz  # noqa: E402
for name in ("segment_plot", "trace_plot"):
    page = getattr(_memory_viz, name)(snap)
    with open(os.path.join(out, f"torch-{name}.html"), "w") as f:
        f.write(page)
    # The page is PyTorch's viewer loaded with the snapshot it was given, pickled and base64'd
    # into the page: read it back and compare with what gpumem exported.
    embedded = re.search(r'"base64": "([A-Za-z0-9+/=]+)"', page) if isinstance(page, str) else None
    shown = pickle.loads(base64.b64decode(embedded.group(1))) if embedded else None
    check(f"torch.cuda._memory_viz.{name} makes a page that shows gpumem's snapshot",
          "<html" in page.lower() and shown is not None and shown["segments"] == snap["segments"],
          f"{len(page)} characters")
check("the snapshot lists the live tensor", any(b["address"] == a.data_ptr() and b["state"] == "active_allocated"
                                              for s in snap["segments"] for b in s["blocks"]))

finish()
