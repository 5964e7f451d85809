"""Snapshots in PyTorch's format (read back by the pickle module) and the process-wide recorder
(read back by gpumem-trace)."""
import json
import os
import pickle
import re
import shutil
import subprocess
import threading

import pytest

import gpumem_runtime
from gpumem_runtime import GpumemError, _abi

# What torch.cuda._memory_viz's segment and trace views read of each segment and block.
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}


def test_snapshot_has_the_allocation(chunks):
    ptr = chunks.malloc(3000)
    snap = gpumem_runtime.snapshot(0)
    assert set(snap) >= {"segments", "device_traces"}
    blocks = [b for s in snap["segments"] for b in s["blocks"]]
    (block,) = [b for b in blocks if b["address"] == ptr]
    assert block["state"] == "active_allocated" and block["requested_size"] == 3000
    for seg in snap["segments"]:
        assert SEGMENT_KEYS <= set(seg)
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]


def test_exported_snapshot_is_pytorchs_pickle(chunks, tmp_path):
    ptr = chunks.malloc(1 << 20)
    path = tmp_path / "snapshot.pickle"
    gpumem_runtime.export_snapshot(path, 0)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert isinstance(snap["device_traces"], list) and snap["device_traces"][0] == []
    segments = snap["segments"]
    assert any(b["address"] == ptr and b["state"] == "active_allocated" for s in segments for b in s["blocks"])
    for seg in segments:
        assert SEGMENT_KEYS <= set(seg)
        for block in seg["blocks"]:
            assert BLOCK_KEYS <= set(block)
            assert block["state"] in ("inactive", "active_allocated", "active_pending_free")
    assert segments == gpumem_runtime.snapshot(0)["segments"], "the pickle holds what snapshot() gives"


def test_export_to_a_bad_path_raises(tmp_path):
    with pytest.raises(GpumemError, match="cannot write"):
        gpumem_runtime.export_snapshot(tmp_path / "missing" / "x.pickle", 0)


def _gpumem_trace():
    found = os.environ.get("GPUMEM_TRACE") or shutil.which("gpumem-trace")
    if not found:
        pytest.skip("gpumem-trace not found: set GPUMEM_TRACE (cargo build --release -p gpumem-trace)")
    return found


def test_recording_sees_every_thread_and_gpumem_trace_reads_it(tmp_path):
    path = tmp_path / "trace.jsonl"

    def work(size):
        stream = None
        ptr = _abi.lib.gpumem_torch_malloc(size, 0, stream)
        assert ptr, gpumem_runtime.last_error()
        _abi.lib.gpumem_torch_free(ptr, size, 0, stream)

    with gpumem_runtime.Recording(path) as recording:
        threads = [threading.Thread(target=work, args=(4096 * (i + 1),)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert recording.lines == len(lines)
    mallocs = [e for e in lines if e["hook"] == "malloc"]
    assert sorted(e["size"] for e in mallocs) == [4096, 8192, 12288, 16384]
    assert len({e["thread"] for e in mallocs}) == 4, "each thread's allocations are recorded"

    result = subprocess.run([_gpumem_trace(), "stats", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert re.search(r"pool allocations\s+4 \(4 freed, 0 live", result.stdout), result.stdout
    assert re.search(r"bytes requested\s+40960 ", result.stdout), result.stdout


def test_one_recording_at_a_time(tmp_path):
    gpumem_runtime.start_recording(tmp_path / "a.jsonl")
    try:
        with pytest.raises(GpumemError, match="already running"):
            gpumem_runtime.start_recording(tmp_path / "b.jsonl")
    finally:
        assert gpumem_runtime.stop_recording() >= 0
    with pytest.raises(GpumemError, match="no recording"):
        gpumem_runtime.stop_recording()
