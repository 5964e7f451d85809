"""gpumem: a caching GPU memory pool for PyTorch and CuPy, with PyTorch's statistics, snapshots
and a process-wide recorder.

    import gpumem_runtime.torch as gpumem     # or gpumem_runtime.cupy
    gpumem.enable()                           # before the first CUDA allocation

The functions here take a device index; the framework modules' take their framework's devices
and default to the current one. See python/README.md.
"""
from ._core import *  # noqa: F401,F403
from ._core import __all__

__version__ = version()  # noqa: F405
