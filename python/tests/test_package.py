"""The package itself: it loads its own library, names growth policies, sets limits, reports
errors as GpumemError with gpumem's message."""
import os

import pytest

import gpumem_runtime
from gpumem_runtime import GpumemError, _abi


def test_the_package_finds_its_own_library():
    assert os.path.dirname(_abi.path) == os.path.dirname(gpumem_runtime.__file__)
    assert gpumem_runtime.version() == gpumem_runtime.__version__
    assert gpumem_runtime.backend() in ("host", "cuda")


@pytest.mark.parametrize("name,policy", [
    ("cache_until_out_of_memory", "cache_until_out_of_memory"),
    ("CacheUntilOutOfMemory", "cache_until_out_of_memory"),
    ("cupy", "cache_until_out_of_memory"),
    ("default", "cache_until_out_of_memory"),
    ("release-before-grow", "release_before_grow"),
    ("release", "release_before_grow"),
    ("HoldPeakInUse", "hold_peak_in_use"),
    ("HOLD_PEAK_IN_USE", "hold_peak_in_use"),
    ("hold_peak", "hold_peak_in_use"),
    ("Segments", "segments"),
    ("segmented", "segments"),
])
def test_growth_policies_by_name_and_alias(name, policy, spare_device):
    assert gpumem_runtime.policy_name(name) == policy
    gpumem_runtime.set_growth_policy(name, spare_device)
    assert gpumem_runtime.get_growth_policy(spare_device) == policy


def test_unknown_policy_is_a_clear_error(spare_device):
    with pytest.raises(ValueError, match="unknown growth policy 'fastest'; known: cache_until_out_of_memory"):
        gpumem_runtime.set_growth_policy("fastest", spare_device)
    with pytest.raises(TypeError):
        gpumem_runtime.policy_name(3)
    assert gpumem_runtime.get_growth_policy(spare_device) == "cache_until_out_of_memory"


def test_limits_in_bytes_and_fractions(spare_device):
    gpumem_runtime.set_limit(1 << 20, spare_device)
    assert gpumem_runtime.get_limit(spare_device) == 1 << 20
    gpumem_runtime.set_limit(None, spare_device)
    assert gpumem_runtime.get_limit(spare_device) == 0
    gpumem_runtime.set_limit(0.5, spare_device)
    assert gpumem_runtime.get_limit(spare_device) > 0
    with pytest.raises(ValueError):
        gpumem_runtime.set_limit(-5, spare_device)
    with pytest.raises(GpumemError, match="gpumem_set_limit_fraction"):
        gpumem_runtime.set_limit(1.5, spare_device)


def test_unknown_device_raises_with_gpumems_message():
    with pytest.raises(GpumemError, match="gpumem_memory_stats"):
        gpumem_runtime.memory_stats(99)
    with pytest.raises(GpumemError):
        gpumem_runtime.get_growth_policy(-1)
    assert "gpumem_get_growth_policy" in gpumem_runtime.last_error()


def test_bad_frees_fail_and_free_nothing(chunks):
    ptr = chunks.malloc(4096)
    _abi.lib.gpumem_torch_free(ptr + 512, 4096, 0, None)
    assert "not an address gpumem lent" in gpumem_runtime.last_error()
    assert gpumem_runtime.memory_stats(0)["allocation.all.current"] >= 1
    chunks.free(ptr)
