//! `gpumem_runtime._native`: the extension module that carries gpumem's C ABI into a wheel.
//!
//! The Python package calls the C ABI (`gpumem.h`) through ctypes on this very file, whose
//! dynamic symbols include every `gpumem_*` entry point of gpumem-capi, and hands their addresses
//! to PyTorch's and CuPy's allocator interfaces. The module itself only says which library it is,
//! so that the package can tell a wheel from an unrelated file.

use pyo3::prelude::*;

// Linked for its exported entry points alone: no Rust code here calls them.
use gpumem_capi as _;

/// The crate's version, which is gpumem's.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The backend the library was built with: `"cuda"` or `"host"`.
#[pyfunction]
fn backend() -> &'static str {
    if cfg!(feature = "cuda") {
        "cuda"
    } else {
        "host"
    }
}

/// The module: `version()` and `backend()`; the C entry points are reached through ctypes.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(backend, m)?)?;
    Ok(())
}
