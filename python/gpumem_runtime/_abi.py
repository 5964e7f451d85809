"""The C ABI (capi/include/gpumem.h) through ctypes, on the package's own extension module.

The extension module ``gpumem_runtime._native`` is gpumem's C ABI built into a Python extension:
its dynamic symbols include every ``gpumem_*`` entry point. Loading that file with ctypes needs no
path from the user and no environment variable.
"""
import ctypes

from . import _native

c_int, c_size_t, c_ssize_t, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_char_p)

#: gpumem.h's ``gpumem_oom_observer``.
OOM_OBSERVER = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)

_SIGNATURES = {
    "gpumem_torch_malloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
    "gpumem_torch_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
    "gpumem_cupy_malloc": (c_void_p, [c_void_p, c_size_t, c_int]),
    "gpumem_cupy_free": (None, [c_void_p, c_void_p, c_int]),
    "gpumem_record_stream": (c_int, [c_void_p, c_void_p]),
    "gpumem_last_error": (c_char_p, []),
    "gpumem_version": (c_char_p, []),
    "gpumem_set_limit": (c_int, [c_int, c_size_t]),
    "gpumem_set_limit_fraction": (c_int, [c_int, ctypes.c_double]),
    "gpumem_get_limit": (c_int, [c_int, ctypes.POINTER(c_size_t)]),
    "gpumem_set_growth_policy": (c_int, [c_int, c_char_p]),
    "gpumem_get_growth_policy": (c_char_p, [c_int]),
    "gpumem_free_all_blocks": (c_int, [c_int]),
    "gpumem_memory_stats": (c_ssize_t, [c_int, c_char_p, c_size_t]),
    "gpumem_memory_summary": (c_ssize_t, [c_int, c_char_p, c_size_t]),
    "gpumem_reset_peak_stats": (c_int, [c_int]),
    "gpumem_snapshot_json": (c_ssize_t, [c_int, c_char_p, c_size_t]),
    "gpumem_export_snapshot": (c_int, [c_int, c_char_p]),
    "gpumem_recorder_start": (c_int, [c_char_p]),
    "gpumem_recorder_stop": (ctypes.c_int64, []),
    "gpumem_add_oom_observer": (c_int, [c_int, OOM_OBSERVER, c_void_p]),
    "gpumem_clear_oom_observers": (c_int, [c_int]),
    "gpumem_step": (c_int, [c_int]),
    "gpumem_plan_automatically": (c_int, [c_int]),
    "gpumem_reset_planning": (c_int, [c_int]),
    "gpumem_plan_state": (c_int, [c_int]),
}


def _load():
    lib = ctypes.CDLL(_native.__file__)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


#: The loaded library; the same file the interpreter imported as ``_native``.
lib = _load()
#: Its path, for PyTorch's ``CUDAPluggableAllocator``.
path = _native.__file__


def address(name):
    """The address of the entry point ``name``, for the frameworks' function-pointer interfaces."""
    return ctypes.cast(getattr(lib, name), c_void_p).value
