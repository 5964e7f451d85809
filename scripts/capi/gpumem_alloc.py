"""gpumem's memory pool as PyTorch's or CuPy's allocator, through gpumem's C ABI.

Build the shared library once (no other build step):

    cargo build --release -p gpumem-capi --features cuda   # target/release/libgpumem_capi.so

then, before the framework allocates anything on the GPU:

    import gpumem_alloc
    gpumem_alloc.use_in_pytorch("target/release/libgpumem_capi.so")   # or use_in_cupy(...)
    ...
    print(gpumem_alloc.stats())

PyTorch and CuPy load the same file, so the statistics read here through ctypes are those of the
pool the framework allocates from. See capi/src/lib.rs for what each entry point does.
"""
import ctypes
import os

__all__ = [
    "load", "use_in_pytorch", "use_in_cupy", "stats", "last_error", "version", "set_limit",
    "set_limit_fraction", "get_limit", "set_growth_policy", "get_growth_policy", "free_all_blocks",
    "debug_print_hook_begin", "debug_print_hook_end", "step", "plan_automatically", "plan_state",
    "reset_peak_stats", "memory_stats", "GpumemError",
]

GROWTH_POLICIES = ("cache_until_out_of_memory", "release_before_grow", "hold_peak_in_use", "segments")


class GpumemStats(ctypes.Structure):
    """gpumem.h's gpumem_stats, field for field."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "used_bytes", "free_bytes", "total_bytes", "limit_bytes", "n_free_blocks", "peak_held_bytes",
    )] + [(name, ctypes.c_uint64) for name in (
        "n_live", "n_mallocs", "n_frees", "n_cross_stream_frees", "n_failed_mallocs", "n_failed_frees",
        "n_failed_other", "n_raw_allocs", "n_raw_frees",
    )]


class GpumemError(RuntimeError):
    """A gpumem call failed; the message is gpumem's."""


_lib = None
_lib_path = None


def load(lib_path=None):
    """Loads libgpumem_capi (once; later calls return the same library) and declares its
    functions' C types. `lib_path` defaults to $GPUMEM_CAPI_LIB."""
    global _lib, _lib_path
    if lib_path is None:
        lib_path = os.environ.get("GPUMEM_CAPI_LIB")
    if _lib is not None:
        if lib_path is not None and os.path.realpath(lib_path) != os.path.realpath(_lib_path):
            raise GpumemError(f"gpumem is already loaded from {_lib_path}, not {lib_path}")
        return _lib
    if lib_path is None:
        raise GpumemError("no library path given and GPUMEM_CAPI_LIB is not set")
    lib_path = os.path.abspath(lib_path)
    lib = ctypes.CDLL(lib_path)
    c_int, c_size_t, c_ssize_t, c_void_p, c_char_p = (
        ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_char_p)
    signatures = {
        "gpumem_torch_malloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
        "gpumem_torch_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
        "gpumem_cupy_malloc": (c_void_p, [c_void_p, c_size_t, c_int]),
        "gpumem_cupy_free": (None, [c_void_p, c_void_p, c_int]),
        "gpumem_last_error": (c_char_p, []),
        "gpumem_version": (c_char_p, []),
        "gpumem_set_limit": (c_int, [c_int, c_size_t]),
        "gpumem_set_limit_fraction": (c_int, [c_int, ctypes.c_double]),
        "gpumem_get_limit": (c_int, [c_int, ctypes.POINTER(c_size_t)]),
        "gpumem_set_growth_policy": (c_int, [c_int, c_char_p]),
        "gpumem_get_growth_policy": (c_char_p, [c_int]),
        "gpumem_get_stats": (c_int, [c_int, ctypes.POINTER(GpumemStats)]),
        "gpumem_free_all_blocks": (c_int, [c_int]),
        "gpumem_debug_print_hook_begin": (c_int, [c_char_p]),
        "gpumem_debug_print_hook_end": (c_int, []),
        "gpumem_recorder_start": (c_int, [c_char_p]),
        "gpumem_recorder_stop": (ctypes.c_int64, []),
        "gpumem_step": (c_int, [c_int]),
        "gpumem_plan_automatically": (c_int, [c_int]),
        "gpumem_plan_state": (c_int, [c_int]),
        "gpumem_reset_peak_stats": (c_int, [c_int]),
        "gpumem_memory_stats": (c_ssize_t, [c_int, c_char_p, c_size_t]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _lib, _lib_path = lib, lib_path
    return lib


def _check(status):
    if status != 0:
        raise GpumemError(last_error() or "unknown gpumem error")


def last_error():
    """The message of this thread's last failed gpumem call, or None."""
    message = load().gpumem_last_error()
    return message.decode() if message is not None else None


def version():
    return load().gpumem_version().decode()


def set_limit(bytes_, device=0):
    """Limits the bytes `device`'s pool holds; 0 removes the limit."""
    _check(load().gpumem_set_limit(device, bytes_))


def set_limit_fraction(fraction, device=0):
    """Limits `device`'s pool to a fraction of the device's memory; 0 removes the limit."""
    _check(load().gpumem_set_limit_fraction(device, fraction))


def get_limit(device=0):
    out = ctypes.c_size_t(0)
    _check(load().gpumem_get_limit(device, ctypes.byref(out)))
    return out.value


def set_growth_policy(name, device=0):
    """One of GROWTH_POLICIES."""
    _check(load().gpumem_set_growth_policy(device, name.encode()))


def get_growth_policy(device=0):
    name = load().gpumem_get_growth_policy(device)
    if name is None:
        raise GpumemError(last_error())
    return name.decode()


def free_all_blocks(device=0):
    """Releases `device`'s cached free blocks (PyTorch's empty_cache, CuPy's free_all_blocks)."""
    _check(load().gpumem_free_all_blocks(device))


def step(device=0):
    """Marks the end of an iteration on `device`: the loop's plan (see gpumem.h's gpumem_step)."""
    _check(load().gpumem_step(device))


def plan_automatically(device=0):
    """Plans the loop on `device` with no step() calls: the pool finds the loop's period itself
    (see gpumem.h's gpumem_plan_automatically)."""
    _check(load().gpumem_plan_automatically(device))


def reset_peak_stats(device=0):
    """Sets every peak of `device`'s statistics to its current value."""
    _check(load().gpumem_reset_peak_stats(device))


def plan_state(device=0):
    """0: no planning, 1: recording the loop, 2: a plan in force, 3: watching for the loop's
    period."""
    state = load().gpumem_plan_state(device)
    if state < 0:
        raise GpumemError(last_error() or "unknown gpumem error")
    return state


def memory_stats(device=0):
    """`device`'s statistics with PyTorch's memory_stats() keys, as a dict (gpumem.h's
    gpumem_memory_stats): "reserved_bytes.all.peak" is the most held since the last
    reset_peak_stats()."""
    lib = load()
    n = lib.gpumem_memory_stats(device, None, 0)
    if n < 0:
        raise GpumemError(last_error() or "unknown gpumem error")
    buf = ctypes.create_string_buffer(n + 1)
    n = lib.gpumem_memory_stats(device, buf, n + 1)
    if n < 0:
        raise GpumemError(last_error() or "unknown gpumem error")
    import json
    return json.loads(buf.raw[:n].decode())


def stats(device=0):
    """`device`'s pool statistics and the ABI's counters, as a dict (see gpumem.h)."""
    out = GpumemStats()
    _check(load().gpumem_get_stats(device, ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in GpumemStats._fields_}


def debug_print_hook_begin(path):
    """gpumem's DebugPrintHook (CuPy's JSON lines) on this thread, into the file at `path`."""
    _check(load().gpumem_debug_print_hook_begin(os.fsencode(path)))


def debug_print_hook_end():
    _check(load().gpumem_debug_print_hook_end())


def recorder_start(path):
    """Records every thread's allocations, frees, raw calls and iteration boundaries, process-wide,
    into the file at `path` (JSON lines, the format `gpumem-trace` reads)."""
    _check(load().gpumem_recorder_start(os.fsencode(path)))


def recorder_stop():
    """Stops the recording and closes its file; returns the lines written."""
    lines = load().gpumem_recorder_stop()
    if lines < 0:
        raise GpumemError(last_error() or "unknown gpumem error")
    return lines


def _configure(growth_policy, limit, devices):
    for device in devices:
        if growth_policy is not None:
            set_growth_policy(growth_policy, device)
        if limit is not None:
            set_limit(limit, device)


def use_in_pytorch(lib_path=None, growth_policy=None, limit=None):
    """Makes gpumem PyTorch's CUDA allocator (torch.cuda.memory.CUDAPluggableAllocator). Call it
    before PyTorch allocates GPU memory: PyTorch refuses to swap an allocator in use.

    With growth_policy=None the pool keeps the C ABI's default, "segments" with blocks that grow in
    place (GPUMEM_EXPANDABLE_SEGMENTS=0 turns growing off), which held 1.04 times the memory in use
    on GPT-2 generate() over varied lengths where CuPy's rule held 8.3 times, and 1.003 / 1.018 on
    the recorded training traces (BENCHMARKS.md); `gpumem-trace recommend TRACE` names the best
    set-up for a trace of yours.

    PyTorch's statistics (memory_reserved, memory_stats) are not available with a pluggable
    allocator; read gpumem's with stats(). PyTorch does not check an allocation for failure, so an
    out-of-memory shows later as an illegal address; stats()["n_failed_mallocs"] counts them."""
    import torch

    lib = load(lib_path)
    _configure(growth_policy, limit, range(torch.cuda.device_count()))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "gpumem_torch_malloc", "gpumem_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return lib


def use_in_cupy(lib_path=None, growth_policy=None, limit=None):
    """Makes gpumem CuPy's allocator (cupy.cuda.set_allocator with a CFunctionAllocator).

    CuPy 14 does not check a CFunctionAllocator's result for null, so the allocator installed
    here raises cupy.cuda.memory.OutOfMemoryError (a subclass of it carrying gpumem's message)
    when gpumem returns null for a non-zero size. Returns the allocator function."""
    import cupy

    lib = load(lib_path)
    _configure(growth_policy, limit, range(cupy.cuda.runtime.getDeviceCount()))
    malloc = ctypes.cast(lib.gpumem_cupy_malloc, ctypes.c_void_p).value
    free = ctypes.cast(lib.gpumem_cupy_free, ctypes.c_void_p).value
    # `lib` as the owner keeps the library (and so both functions) loaded while CuPy uses them.
    c_allocator = cupy.cuda.memory.CFunctionAllocator(0, malloc, free, lib)
    base = cupy.cuda.memory.OutOfMemoryError

    class GpumemOutOfMemoryError(base):
        def __init__(self, message):  # pylint: disable=super-init-not-called
            MemoryError.__init__(self, message)

    def gpumem_malloc(size):
        memptr = c_allocator.malloc(size)
        if size > 0 and memptr.ptr == 0:
            # gpumem_last_error is per thread: this is the thread that just called malloc. Without
            # the entry point's name, the message reads as CuPy's own pool's.
            message = last_error() or f"gpumem could not allocate {size} bytes"
            raise GpumemOutOfMemoryError(message.removeprefix("gpumem_cupy_malloc: "))
        return memptr

    gpumem_malloc.error_type = GpumemOutOfMemoryError
    cupy.cuda.set_allocator(gpumem_malloc)
    return gpumem_malloc
