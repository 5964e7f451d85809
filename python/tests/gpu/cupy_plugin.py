"""A pytest plugin that makes gpumem CuPy's allocator before any test runs: CuPy's own tests with
``-p cupy_plugin`` run on gpumem's pool."""


def pytest_configure(config):
    import gpumem_runtime.cupy as gpumem
    gpumem.enable()
    print("gpumem is CuPy's allocator for these tests")
