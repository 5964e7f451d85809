"""gpumem as PyTorch's CUDA allocator.

    import gpumem_runtime.torch as gpumem
    gpumem.enable(policy="hold_peak_in_use", limit=0.9)   # before the first CUDA allocation
    ...
    print(gpumem.memory_summary())

enable() installs gpumem through PyTorch's pluggable-allocator interface, with a small C++ shim
compiled once against the installed PyTorch (it needs a C++ compiler and the CUDA runtime's
headers; the library is cached under ``$GPUMEM_RUNTIME_CACHE`` or ``~/.cache/gpumem_runtime``):
through it an out-of-memory raises ``torch.OutOfMemoryError`` with gpumem's message at the
allocating call, and ``Tensor.record_stream`` keeps memory from reuse until the recorded stream's
work completes. PyTorch's own ``torch.cuda.memory_stats()`` and friends do not work with a
pluggable allocator: use this module's, which take the same device arguments.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess

from . import _abi, _framework
from ._core import GpumemError, Recording, start_recording, stop_recording  # noqa: F401 (exported)

__all__ = [
    "enable", "is_enabled", "memory_stats", "memory_summary", "reset_peak_memory_stats",
    "snapshot", "export_snapshot", "empty_cache", "free_all_blocks", "start_recording",
    "stop_recording", "Recording", "add_oom_observer", "clear_oom_observers", "step",
    "plan_automatically", "reset_planning", "plan_state",
]

_enabled = False


def _device_index(device):
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"gpumem manages CUDA memory, not {device.type!r}")
    return device.index if device.index is not None else torch.cuda.current_device()


def _shim_path():
    """The shim's library, compiled against the installed PyTorch on first use and cached."""
    import torch
    from torch.utils import cpp_extension

    source = os.path.join(os.path.dirname(__file__), "_torch_shim.cpp")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode() + torch.__file__.encode()).hexdigest()[:16]
    cache = os.environ.get("GPUMEM_RUNTIME_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gpumem_runtime")
    os.makedirs(cache, exist_ok=True)
    target = os.path.join(cache, f"torch_shim-{digest}.so")
    if os.path.exists(target):
        return target
    includes = list(cpp_extension.include_paths())
    includes += _cuda_include_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cxx = os.environ.get("CXX") or next(filter(shutil.which, ("c++", "g++", "clang++")), None)
    if cxx is None:
        raise GpumemError("no C++ compiler (c++, g++ or clang++; or $CXX) to build gpumem's PyTorch shim; "
                          "enable(shim=False) goes without it, losing torch.OutOfMemoryError and record_stream")
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    partial = f"{target}.{os.getpid()}.tmp"
    command = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    command += [f"-I{d}" for d in includes]
    command += [source, "-o", partial, f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-ltorch_cuda", "-lc10_cuda", "-lc10"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise GpumemError(
            "could not compile gpumem's PyTorch shim (it needs a C++ compiler and the CUDA runtime's "
            "headers; enable(shim=False) goes without it, losing torch.OutOfMemoryError and "
            f"record_stream):\n{' '.join(command)}\n{result.stderr[-4000:]}")
    os.replace(partial, target)
    return target


def _cuda_include_dirs():
    """Where cuda_runtime_api.h is: $CUDA_HOME, PyTorch's idea of it, or the NVIDIA wheels."""
    candidates = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "include"))
    try:
        from torch.utils.cpp_extension import CUDA_HOME
        if CUDA_HOME:
            candidates.append(os.path.join(CUDA_HOME, "include"))
    except ImportError:
        pass
    try:
        import nvidia
        for root in nvidia.__path__:
            for sub in sorted(os.listdir(root)):
                candidates.append(os.path.join(root, sub, "include"))
    except ImportError:
        pass
    return [d for d in candidates if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))][:1]


def _install_with_shim():
    shim = ctypes.CDLL(_shim_path())
    shim.gpumem_torch_shim_install.restype = ctypes.c_int
    shim.gpumem_torch_shim_install.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(4096)
    status = shim.gpumem_torch_shim_install(
        _abi.address("gpumem_torch_malloc"), _abi.address("gpumem_torch_free"),
        _abi.address("gpumem_record_stream"), _abi.address("gpumem_last_error"), error, len(error))
    if status != 0:
        raise GpumemError(f"PyTorch refused gpumem's allocator: {error.value.decode(errors='replace')}")
    _install_with_shim.library = shim  # kept loaded: PyTorch calls into it from now on


def enable(policy=None, limit=None, device=None, shim=True):
    """Makes gpumem PyTorch's CUDA allocator. Call it before anything allocates CUDA memory
    (before CUDA is initialised): PyTorch cannot swap an allocator in use, and enable() raises
    GpumemError then.

    ``policy``: a growth policy's name (see gpumem_runtime.GROWTH_POLICIES and its aliases);
    ``limit``: bytes (int) or a fraction of the device's memory (float); each may be a dict
    ``{device: value}``. ``device``: the device (an index, ``"cuda:1"`` or a torch.device) whose pool
    ``policy`` and ``limit`` apply to; None for every device. Allocation past the limit raises
    ``torch.OutOfMemoryError`` with gpumem's message, after the pool released its cache and
    retried.

    ``shim=False`` goes without the compiled shim: PyTorch's plain pluggable allocator, where an
    out-of-memory returns a null pointer that PyTorch does not check and ``record_stream`` is
    ignored. Only for machines without a compiler."""
    global _enabled
    import torch

    if _enabled:
        raise GpumemError("gpumem is already PyTorch's allocator")
    if torch.cuda.is_initialized():
        raise GpumemError(
            "CUDA is already initialised in this process, so PyTorch's allocator is in use and cannot "
            "be replaced: call gpumem_runtime.torch.enable() before the first CUDA tensor or call")
    devices = range(torch.cuda.device_count()) if device is None else [_device_index(device)]
    _framework.configure(policy, limit, devices)
    if shim:
        _install_with_shim()
    else:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_abi.path, "gpumem_torch_malloc", "gpumem_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)
    _enabled = True


def is_enabled():
    """Whether enable() made gpumem PyTorch's allocator in this process."""
    return _enabled


(memory_stats, memory_summary, reset_peak_memory_stats, snapshot, export_snapshot, free_all_blocks,
 add_oom_observer, clear_oom_observers) = _framework.DeviceTools(_device_index).functions()
step, plan_automatically, reset_planning, plan_state = _framework.DeviceTools(_device_index).planning()
#: ``torch.cuda.empty_cache()`` for gpumem's pool.
empty_cache = free_all_blocks
