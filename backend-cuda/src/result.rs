//! The checked-call layer over the driver entry points of [`crate::sys`]: loading the driver,
//! `cuInit`, and turning a `CUresult` into gpumem's [`Error`].
//!
//! Nothing in this crate calls a `sys` function before [`init`] has succeeded: it opens the
//! library, resolves every entry point `sys` declares and calls `cuInit(0)`, once per process.
//!
//! Codes are integers from the FFI boundary on (`sys` declares every entry point with a `c_int`
//! result), so a code a newer driver adds (`CUDA_ERROR_CONTAINED`, 226, from 12.8, for one) is an
//! ordinary value; the driver names it (`cuGetErrorName`).

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use crate::sys::{self, CUresult};
use gpumem_core::{Error, Result};

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "cuda";

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`: also what `cuPointerGetAttribute` answers for host memory the
/// driver does not know.
pub(crate) const ERROR_INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) const ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_STUB_LIBRARY`: the libcuda found is the toolkit's link stub, not a driver.
pub(crate) const ERROR_STUB_LIBRARY: CUresult = 34;
/// `CUDA_ERROR_NO_DEVICE`.
pub(crate) const ERROR_NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_NOT_READY`: a query found work still pending.
pub(crate) const ERROR_NOT_READY: CUresult = 600;
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
pub(crate) const ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;

/// The integer value of a driver result (already an integer: kept so call sites read the same).
#[inline]
pub(crate) fn code(result: CUresult) -> CUresult {
    result
}

/// Whether libcuda can be loaded, asked once per process.
pub(crate) fn library_present() -> bool {
    sys::library_present()
}

/// Why the driver could not be started; kept so every later call reports the same error.
#[derive(Clone, Copy)]
enum InitFailure {
    /// libcuda could not be loaded.
    NoLibrary,
    /// libcuda lacks an entry point (a driver older than CUDA 12.0).
    MissingSymbol(&'static str),
    /// `cuInit` failed.
    Init(CUresult),
}

impl InitFailure {
    /// The error every call reports after this failure.
    fn to_error(self) -> Error {
        match self {
            InitFailure::NoLibrary => {
                let tried = sys::LIBRARY_NAMES;
                Error::DriverNotFound {
                    backend: BACKEND,
                    detail: format!(
                        "the NVIDIA driver library (libcuda) could not be loaded; tried {}. \
                         Install the NVIDIA driver (it provides libcuda.so.1; the CUDA toolkit is not needed) \
                         or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH; on a machine without an \
                         NVIDIA GPU, run on the CPU instead: build with gpumem's `auto` feature beside `cuda` \
                         (features = [\"cuda\", \"auto\"]): such a build falls back to the host \
                         backend by itself, and GPUMEM_BACKEND=host forces it; or name gpumem::host::Host",
                        tried.join(", ")
                    ),
                }
            }
            InitFailure::MissingSymbol(symbol) => Error::DriverNotFound {
                backend: BACKEND,
                detail: format!(
                    "the NVIDIA driver library does not export {symbol}: gpumem needs a driver for CUDA 12.0 \
                     or newer; update the NVIDIA driver"
                ),
            },
            InitFailure::Init(result) if code(result) == ERROR_STUB_LIBRARY => Error::DriverNotFound {
                backend: BACKEND,
                detail: "the libcuda found is the CUDA toolkit's stub library, not an NVIDIA driver: \
                         install the driver, or put the folder of the driver's libcuda.so.1 before the \
                         toolkit's `stubs` folder in LD_LIBRARY_PATH"
                    .into(),
            },
            InitFailure::Init(result) => error("cuInit", result),
        }
    }
}

/// Loads the driver and initialises it, once per process; every later call gives the first
/// call's answer. Call this before any `sys` function.
///
/// # Errors
///
/// `DriverNotFound` when libcuda is missing, is the toolkit's stub or lacks an entry point this
/// crate uses; `NoDevice` when `cuInit` finds no device; the driver's error from `cuInit`.
pub(crate) fn init() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), InitFailure>> = OnceLock::new();
    match STATE.get_or_init(initialise) {
        Ok(()) => Ok(()),
        Err(failure) => Err(failure.to_error()),
    }
}

/// The work of [`init`]: load, check the entry points, `cuInit(0)`.
fn initialise() -> std::result::Result<(), InitFailure> {
    match sys::load() {
        Ok(()) => {}
        Err(sys::LoadError::NoLibrary) => return Err(InitFailure::NoLibrary),
        Err(sys::LoadError::MissingSymbol(missing)) => return Err(InitFailure::MissingSymbol(missing)),
    }
    // SAFETY: the entry points are resolved; the flags must be 0.
    let result = unsafe { sys::cuInit(0) };
    if code(result) != SUCCESS {
        return Err(InitFailure::Init(result));
    }
    Ok(())
}

/// `Ok(())` for `CUDA_SUCCESS`, else the mapped error of `api`.
///
/// # Errors
///
/// The mapped error (see [`error`]).
#[inline]
pub(crate) fn check(api: &'static str, result: CUresult) -> Result<()> {
    if code(result) == SUCCESS {
        Ok(())
    } else {
        Err(error(api, result))
    }
}

/// As [`check`], for an allocation of `size` bytes: `CUDA_ERROR_OUT_OF_MEMORY` becomes
/// [`Error::OutOfMemory`] with `total: None`, so the pool's retry ladder runs.
///
/// # Errors
///
/// `OutOfMemory`, or the mapped error.
#[inline]
pub(crate) fn check_alloc(api: &'static str, result: CUresult, size: usize) -> Result<()> {
    match code(result) {
        SUCCESS => Ok(()),
        ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory { size, total: None }),
        _ => Err(error(api, result)),
    }
}

/// The error for a failed call of `api`: `NoDevice` for `CUDA_ERROR_NO_DEVICE`, otherwise
/// [`Error::Backend`] with the code and the driver's own name and description of it.
pub(crate) fn error(api: &'static str, result: CUresult) -> Error {
    let code = code(result);
    if code == ERROR_NO_DEVICE {
        return Error::NoDevice { backend: BACKEND };
    }
    let (name, message) = describe(result);
    Error::backend(BACKEND, api, i64::from(code), name, message)
}

/// The driver's name and description of a code, from `cuGetErrorName` and `cuGetErrorString`,
/// with a plain fallback where the driver cannot say (an unknown code, or no driver loaded).
fn describe(result: CUresult) -> (String, String) {
    let value = code(result);
    let fallback = || (format!("CUresult {value}"), format!("unknown CUDA error code {value}"));
    if !names_available() {
        return fallback();
    }
    let lookup = |f: unsafe fn(CUresult, *mut *const c_char) -> CUresult| -> Option<String> {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `names_available` established that the entry points are resolved; they write a pointer to a static, NUL-terminated string or leave `text`
        // null and return an error for a code they do not know.
        let status = unsafe { f(result, &mut text) };
        if code(status) != SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: on success `text` points to a static NUL-terminated string owned by libcuda.
        Some(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
    };
    let name = lookup(sys::cuGetErrorName);
    let message = lookup(sys::cuGetErrorString);
    match (name, message) {
        (Some(name), Some(message)) => (name, message),
        (Some(name), None) => (name, fallback().1),
        (None, Some(message)) => (fallback().0, message),
        (None, None) => fallback(),
    }
}

/// Whether `cuGetErrorName` and `cuGetErrorString` can be called: the table is loaded (it holds
/// both, or none).
fn names_available() -> bool {
    sys::load().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::SYMBOLS;

    #[test]
    fn a_missing_driver_says_how_to_run_on_the_cpu() {
        match InitFailure::NoLibrary.to_error() {
            Error::DriverNotFound { backend: "cuda", detail } => {
                assert!(detail.contains("features = [\"cuda\", \"auto\"]"), "{detail}");
                assert!(detail.contains("GPUMEM_BACKEND=host"), "{detail}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Every `sys::cu...(` call in the crate's sources names a symbol in [`SYMBOLS`] (which the
    /// compiler enforces too), and every symbol in it is called somewhere, so `init` asks a driver
    /// for exactly the entry points this crate calls.
    #[test]
    fn symbols_cover_every_driver_call() {
        let sources = [
            include_str!("lib.rs"),
            include_str!("result.rs"),
            include_str!("device.rs"),
            include_str!("memory.rs"),
            include_str!("stream.rs"),
            include_str!("event.rs"),
            include_str!("graph.rs"),
            include_str!("vmm.rs"),
        ];
        let mut seen = 0;
        let mut called = std::collections::BTreeSet::new();
        for source in sources {
            for (i, _) in source.match_indices("sys::cu") {
                let rest = &source[i + "sys::".len()..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                let (name, after) = rest.split_at(end);
                // Calls only (`sys::cuInit(`), not types or mentions.
                if after.starts_with('(') {
                    seen += 1;
                    assert!(SYMBOLS.contains(&name), "{name} is called but missing from SYMBOLS");
                }
                // Used: called, or passed as a function (`lookup(sys::cuGetErrorName)`).
                called.insert(name);
            }
        }
        assert!(seen > 40, "only {seen} driver calls found: the scan is broken");
        for symbol in SYMBOLS {
            assert!(called.contains(symbol), "{symbol} is in SYMBOLS but never used");
        }
    }

    #[test]
    fn success_is_ok_and_no_device_maps_without_the_driver() {
        assert!(check("cuInit", SUCCESS).is_ok());
        assert!(matches!(check("cuInit", ERROR_NO_DEVICE), Err(Error::NoDevice { backend: "cuda" })));
        assert!(matches!(
            check_alloc("cuMemAlloc_v2", ERROR_OUT_OF_MEMORY, 4096),
            Err(Error::OutOfMemory { size: 4096, total: None })
        ));
    }

    #[test]
    fn backend_errors_carry_code_name_and_text() {
        // Where a driver is installed, start it as the backend does before any error is mapped.
        let _ = init();
        // With or without a driver on this machine: the driver's words, or the fallback.
        match error("cuMemcpy", ERROR_INVALID_VALUE) {
            Error::Backend { backend, api, code, name, message } => {
                assert_eq!((backend, api, code), ("cuda", "cuMemcpy", 1));
                if names_available() {
                    assert_eq!(name, "CUDA_ERROR_INVALID_VALUE");
                } else {
                    assert_eq!(name, "CUresult 1");
                }
                assert!(!message.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        // A code the 12.0 headers do not know (`CUDA_ERROR_CONTAINED`, from 12.8) is a plain value.
        match error("cuStreamSynchronize", 226) {
            Error::Backend { code, name, .. } => {
                assert_eq!(code, 226);
                assert!(!name.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        // A plain out-of-memory outside an allocation is a backend error like any other.
        assert_eq!(error("cuMemcpy", ERROR_OUT_OF_MEMORY).code(), Some(2));
    }
}
