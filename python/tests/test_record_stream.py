"""gpumem_record_stream as the package calls it: unknown addresses are refused."""
import pytest

import gpumem_runtime
from gpumem_runtime import _abi


def test_record_stream_of_a_lent_chunk(chunks):
    ptr = chunks.malloc(8192)
    assert _abi.lib.gpumem_record_stream(ptr, None) == 0
    chunks.free(ptr)


def test_record_stream_of_an_unknown_address_fails():
    assert _abi.lib.gpumem_record_stream(0x1000, None) == -1
    assert "not an address gpumem lent" in gpumem_runtime.last_error()


@pytest.mark.parametrize("module", ["torch", "cupy"])
def test_framework_modules_import_without_the_framework(module):
    # The modules import their framework only when called: importing them is always possible.
    __import__(f"gpumem_runtime.{module}")
