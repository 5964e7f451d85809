"""Shared helpers: raw allocations through the C ABI, as PyTorch and CuPy make them, on the host
backend (device memory is host memory; two devices are simulated)."""
import ctypes

import pytest

import gpumem_runtime
from gpumem_runtime import _abi


class Chunks:
    """Allocates through gpumem_torch_malloc on the null stream and frees what is left at the end."""

    def __init__(self, device):
        self.device = device
        self.live = {}

    def malloc(self, size, stream=None):
        ptr = _abi.lib.gpumem_torch_malloc(size, self.device, stream)
        if ptr:
            self.live[ptr] = (size, stream)
        return ptr

    def free(self, ptr):
        size, stream = self.live.pop(ptr)
        _abi.lib.gpumem_torch_free(ptr, size, self.device, stream)
        assert gpumem_runtime.last_error() is None


@pytest.fixture
def chunks():
    c = Chunks(0)
    yield c
    for ptr in list(c.live):
        c.free(ptr)


@pytest.fixture
def spare_device():
    """Device 1 (the host backend simulates two), its limit and observers restored afterwards."""
    yield 1
    gpumem_runtime.set_limit(0, 1)
    gpumem_runtime.clear_oom_observers(1)
    gpumem_runtime.set_growth_policy("cache_until_out_of_memory", 1)


def write_bytes(ptr, data):
    """Host-backend memory is host memory: write it directly."""
    ctypes.memmove(ptr, data, len(data))
