"""Statistics with PyTorch's keys, the summary, the peak reset, the cache release and the
out-of-memory observers."""
import gpumem_runtime
from gpumem_runtime import _abi

TORCH_STATS = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "active", "segment")


def test_memory_stats_have_pytorchs_keys(chunks):
    stats = gpumem_runtime.memory_stats(0)
    for name in TORCH_STATS:
        for part in ("current", "peak", "allocated", "freed"):
            assert isinstance(stats[f"{name}.all.{part}"], int), f"{name}.all.{part}"
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"):
        assert isinstance(stats[key], int), key


def test_statistics_follow_allocations_and_peaks_reset(chunks):
    before = gpumem_runtime.memory_stats(0)
    ptr = chunks.malloc(3 << 20)
    during = gpumem_runtime.memory_stats(0)
    assert during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == 3 << 20
    assert during["requested_bytes.all.allocated"] - before["requested_bytes.all.allocated"] == 3 << 20
    assert during["allocation.all.current"] - before["allocation.all.current"] == 1
    assert during["reserved_bytes.all.current"] >= during["allocated_bytes.all.current"]
    chunks.free(ptr)
    after = gpumem_runtime.memory_stats(0)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.peak"] >= during["allocated_bytes.all.current"]
    gpumem_runtime.reset_peak_memory_stats(0)
    reset = gpumem_runtime.memory_stats(0)
    assert reset["allocated_bytes.all.peak"] == reset["allocated_bytes.all.current"]


def test_free_all_blocks_gives_the_cache_back(chunks):
    chunks.free(chunks.malloc(5 << 20))
    assert gpumem_runtime.memory_stats(0)["reserved_bytes.all.current"] > 0
    gpumem_runtime.free_all_blocks(0)
    stats = gpumem_runtime.memory_stats(0)
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] == 0


def test_memory_summary_is_a_table(chunks):
    ptr = chunks.malloc(1 << 20)
    summary = gpumem_runtime.memory_summary(0)
    assert "gpumem memory summary, device 0" in summary
    assert summary.count("\n") > 10
    chunks.free(ptr)


def test_out_of_memory_calls_the_observers_and_counts(spare_device):
    seen = []
    gpumem_runtime.add_oom_observer(lambda device, message: seen.append((device, message)), spare_device)
    gpumem_runtime.set_limit(1 << 20, spare_device)
    before = gpumem_runtime.memory_stats(spare_device)["num_ooms"]
    assert not _abi.lib.gpumem_torch_malloc(64 << 20, spare_device, None)
    assert "Out of memory" in gpumem_runtime.last_error()
    assert len(seen) == 1 and seen[0][0] == spare_device and "Out of memory" in seen[0][1]
    assert gpumem_runtime.memory_stats(spare_device)["num_ooms"] == before + 1
    gpumem_runtime.clear_oom_observers(spare_device)
    assert not _abi.lib.gpumem_torch_malloc(64 << 20, spare_device, None)
    assert len(seen) == 1


def test_an_observer_that_raises_does_not_break_the_allocator(spare_device, capsys):
    def broken(device, message):
        raise RuntimeError("observer bug")

    gpumem_runtime.add_oom_observer(broken, spare_device)
    gpumem_runtime.set_limit(1 << 20, spare_device)
    assert not _abi.lib.gpumem_torch_malloc(64 << 20, spare_device, None)
    assert "Out of memory" in gpumem_runtime.last_error()
    assert "observer bug" in capsys.readouterr().err
