"""gpumem as CuPy's allocator.

    import gpumem_runtime.cupy as gpumem
    gpumem.enable(policy="hold_peak_in_use", limit=2 << 30)
    ...
    print(gpumem.memory_summary())

Allocations come from the null stream's arena (CuPy's default stream), as CuPy's own pool
allocates without a stream. Out of memory raises ``cupy.cuda.memory.OutOfMemoryError`` (a
subclass that carries gpumem's message).
"""
from . import _abi, _core, _framework
from ._core import GpumemError, Recording, start_recording, stop_recording  # noqa: F401 (exported)

__all__ = [
    "enable", "disable", "is_enabled", "memory_stats", "memory_summary", "reset_peak_memory_stats",
    "snapshot", "export_snapshot", "free_all_blocks", "start_recording", "stop_recording",
    "Recording", "add_oom_observer", "clear_oom_observers", "step", "plan_automatically",
    "reset_planning", "plan_state",
]

_allocator = None


def _device_index(device):
    import cupy
    if device is None:
        return cupy.cuda.runtime.getDevice()
    return int(getattr(device, "id", device))


def enable(policy=None, limit=None, device=None):
    """Makes gpumem CuPy's allocator (``cupy.cuda.set_allocator``); memory CuPy's own pool already
    lent stays valid and goes back to that pool. ``policy``, ``limit`` and ``device`` as in
    gpumem_runtime.torch.enable. Returns the allocator function."""
    global _allocator
    import cupy

    devices = range(cupy.cuda.runtime.getDeviceCount()) if device is None else [_device_index(device)]
    _framework.configure(policy, limit, devices)
    c_allocator = cupy.cuda.memory.CFunctionAllocator(
        0, _abi.address("gpumem_cupy_malloc"), _abi.address("gpumem_cupy_free"), _abi.lib)

    class GpumemOutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
        """cupy.cuda.memory.OutOfMemoryError with gpumem's message."""

        def __init__(self, message):  # pylint: disable=super-init-not-called
            # CuPy's own __init__ takes sizes to format its message; gpumem's is already made.
            MemoryError.__init__(self, message)

    def gpumem_malloc(size):
        memptr = c_allocator.malloc(size)
        if size > 0 and memptr.ptr == 0:
            # CuPy does not check a CFunctionAllocator's result; gpumem's message is per thread,
            # and this is the thread that just allocated.
            message = _core.last_error() or f"gpumem could not allocate {size} bytes"
            if "Out of memory" in message:
                raise GpumemOutOfMemoryError(message.removeprefix("gpumem_cupy_malloc: "))
            raise GpumemError(message)
        return memptr

    gpumem_malloc.error_type = GpumemOutOfMemoryError
    cupy.cuda.set_allocator(gpumem_malloc)
    _allocator = gpumem_malloc
    return gpumem_malloc


def disable():
    """Gives CuPy back its default memory pool; memory gpumem lent stays valid until freed."""
    global _allocator
    import cupy
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    _allocator = None


def is_enabled():
    """Whether enable() made gpumem CuPy's allocator (and disable() did not undo it)."""
    return _allocator is not None


(memory_stats, memory_summary, reset_peak_memory_stats, snapshot, export_snapshot, free_all_blocks,
 add_oom_observer, clear_oom_observers) = _framework.DeviceTools(_device_index).functions()
step, plan_automatically, reset_planning, plan_state = _framework.DeviceTools(_device_index).planning()
