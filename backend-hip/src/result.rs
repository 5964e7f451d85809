//! The checked-call layer: the HIP functions this backend calls, resolved from `libamdhip64` at
//! run time and declared so that every code the runtime returns is read soundly; the mapping
//! from HIP's codes to gpumem's errors; and the once-only runtime check every operation starts
//! from.
//!
//! The CUDA backend calls cudarc's `sys` and `result` layers. hip-sys has only the raw layer,
//! and its function declarations return `hipError_t` as a Rust `enum` (bindgen's rustified,
//! `#[repr(u32)]` enum, generated from HIP 5.4's headers). Receiving a value that enum does not
//! list (a code added by a newer runtime, or anything a vendor patch returns) would be undefined
//! behaviour in Rust, however the code is handled afterwards. So [`sys`] declares the functions
//! this backend calls again, with the code as a plain `u32` (the C enum's underlying type, as
//! bindgen itself chose it), and hip-sys supplies the handle types, the argument enums (sound to
//! pass *to* C: gpumem only builds listed variants) and the flag constants.
//!
//! The functions are not linked: [`library`] opens `libamdhip64` with `dlopen` (libloading) on
//! first use and resolves every entry point in [`sys::SYMBOLS`] before the first call, so a program
//! starts without the runtime and a missing library (or entry point) is
//! [`Error::DriverNotFound`]. hip-sys's build script still asks the linker for `amdhip64`, but no
//! symbol of it is referenced, so the linker (`--as-needed`, rustc's default on Linux) records
//! no dependency on it; CI checks the test binaries with `readelf -d`.

use std::ffi::{c_char, CStr, OsStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gpumem_core::{Error, Result};
use hip_sys::hiprt::hipError_t;

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "hip";

/// A HIP status code, as its integer value.
pub(crate) type Code = u32;

/// `hipSuccess`.
pub(crate) const SUCCESS: Code = hipError_t::hipSuccess as Code;
/// `hipErrorInvalidValue`.
pub(crate) const ERROR_INVALID_VALUE: Code = hipError_t::hipErrorInvalidValue as Code;
/// `hipErrorOutOfMemory`.
pub(crate) const ERROR_OUT_OF_MEMORY: Code = hipError_t::hipErrorOutOfMemory as Code;
/// `hipErrorNoDevice`.
pub(crate) const ERROR_NO_DEVICE: Code = hipError_t::hipErrorNoDevice as Code;
/// `hipErrorNotReady`.
pub(crate) const ERROR_NOT_READY: Code = hipError_t::hipErrorNotReady as Code;
/// `hipErrorNotSupported`.
pub(crate) const ERROR_NOT_SUPPORTED: Code = hipError_t::hipErrorNotSupported as Code;
/// `hipErrorPeerAccessAlreadyEnabled`.
pub(crate) const ERROR_PEER_ACCESS_ALREADY_ENABLED: Code =
    hipError_t::hipErrorPeerAccessAlreadyEnabled as Code;

/// Declares the runtime's entry points: a table of function pointers (`Functions`), its
/// loader, the list of their names (`SYMBOLS`), and one `unsafe fn` per entry point that calls
/// through the table.
macro_rules! hip_functions {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        /// The entry points, as the library gave them.
        #[allow(non_snake_case)]
        pub(crate) struct Functions {
            $(pub(crate) $name: unsafe extern "C" fn($($ty),*) -> $ret,)*
        }

        /// Every entry point this crate calls, in declaration order. [`super::library`] resolves
        /// each before the first call; a unit test keeps this list in step with the calls.
        // Read by the unit test that keeps it in step with the calls; loading resolves the same
        // names through `Functions`.
        #[allow(dead_code)]
        pub(crate) const SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        impl Functions {
            /// Resolves every entry point from `lib`, or names the first one it lacks.
            ///
            /// # Safety
            ///
            /// `lib` is a HIP runtime whose entry points have HIP 5.2's signatures, and it stays
            /// loaded while the table is used.
            pub(crate) unsafe fn resolve(
                lib: &libloading::Library,
            ) -> ::std::result::Result<Functions, &'static str> {
                Ok(Functions {
                    $($name: {
                        // SAFETY: the caller guarantees the symbol has this signature; the
                        // pointer is copied out and used only while the library stays loaded.
                        let symbol = unsafe {
                            lib.get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        *symbol.map_err(|_| stringify!($name))?
                    },)*
                })
            }
        }

        $(
            #[allow(non_snake_case, clippy::too_many_arguments)]
            #[doc = concat!("`", stringify!($name), "`, through the loaded library.")]
            ///
            /// # Safety
            ///
            /// As the HIP function's own contract.
            #[inline]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                match super::functions() {
                    // SAFETY: the pointer came from the library, which stays loaded for the rest
                    // of the process; the caller keeps the function's own contract.
                    Some(f) => unsafe { (f.$name)($($arg),*) },
                    None => <$ret as super::NotLoaded>::NOT_LOADED,
                }
            }
        )*
    };
}

/// The HIP runtime's entry points this backend calls, resolved from `libamdhip64` at run time
/// (see [`library`](super::library)), with integer status codes (see the module docs). Every other type comes
/// from hip-sys. The signatures follow HIP 5.2's `hip_runtime_api.h`; Debian's `libamdhip64`
/// 5.2.3 exports each (a test checks it wherever the library is installed).
///
/// Each `sys::hip...` function calls the entry point the library gave. Before [`library`] has
/// loaded it, it returns `hipErrorNotInitialized` (or a null name) without calling anything;
/// no operation gets there, since each starts from [`init`](super::init), which loads the library first.
pub(crate) mod sys {
    use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

    use hip_sys::hiprt::{
        hipDeviceAttribute_t, hipEvent_t, hipMemAccessDesc, hipMemPoolAttr, hipMemPool_t, hipMemcpyKind,
        hipStream_t,
    };

    use super::Code;

    /// `hipStreamCallback_t`, with the status as its integer value (the runtime calls it with a
    /// code, which must be read as soundly as a returned one).
    pub(crate) type StreamCallbackFn =
        unsafe extern "C" fn(stream: hipStream_t, status: Code, data: *mut c_void);

    /// `hipPointerAttribute_t`. hip-sys declares `memoryType` as a Rust enum, and ROCm 6
    /// renumbered `hipMemoryType` (adding `hipMemoryTypeUnregistered = 0`), so it is read here as
    /// an integer. The layout is the same in HIP 5.x and ROCm 6.
    #[repr(C)]
    #[derive(Debug)]
    pub(crate) struct PointerAttributes {
        pub(crate) memory_type: c_int,
        pub(crate) device: c_int,
        pub(crate) device_pointer: *mut c_void,
        pub(crate) host_pointer: *mut c_void,
        pub(crate) is_managed: c_int,
        pub(crate) allocation_flags: c_uint,
    }

    hip_functions! {
        fn hipGetErrorName(code: Code) -> *const c_char;
        fn hipGetErrorString(code: Code) -> *const c_char;
        fn hipGetLastError() -> Code;
        fn hipRuntimeGetVersion(version: *mut c_int) -> Code;

        fn hipGetDeviceCount(count: *mut c_int) -> Code;
        fn hipSetDevice(device: c_int) -> Code;
        fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> Code;
        fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> Code;
        fn hipDeviceGetAttribute(value: *mut c_int, attr: hipDeviceAttribute_t, device: c_int) -> Code;
        fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> Code;
        fn hipDeviceSynchronize() -> Code;
        fn hipDeviceCanAccessPeer(can_access: *mut c_int, device: c_int, peer: c_int) -> Code;
        fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> Code;
        fn hipPointerGetAttributes(attributes: *mut PointerAttributes, ptr: *const c_void) -> Code;

        fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Code;
        fn hipFree(ptr: *mut c_void) -> Code;
        fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Code;
        fn hipHostFree(ptr: *mut c_void) -> Code;
        fn hipDeviceGetDefaultMemPool(pool: *mut hipMemPool_t, device: c_int) -> Code;
        fn hipMemPoolSetAttribute(pool: hipMemPool_t, attr: hipMemPoolAttr, value: *mut c_void) -> Code;
        fn hipMemPoolGetAttribute(pool: hipMemPool_t, attr: hipMemPoolAttr, value: *mut c_void) -> Code;
        fn hipMemPoolTrimTo(pool: hipMemPool_t, min_bytes_to_hold: usize) -> Code;
        fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: hipStream_t) -> Code;
        fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> Code;
        fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: hipMemcpyKind) -> Code;
        fn hipMemcpyAsync(
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
            kind: hipMemcpyKind,
            stream: hipStream_t
        ) -> Code;
        fn hipMemset(dst: *mut c_void, value: c_int, size: usize) -> Code;
        fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, stream: hipStream_t) -> Code;

        fn hipDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> Code;
        fn hipStreamCreateWithPriority(stream: *mut hipStream_t, flags: c_uint, priority: c_int) -> Code;
        fn hipStreamDestroy(stream: hipStream_t) -> Code;
        fn hipStreamGetFlags(stream: hipStream_t, flags: *mut c_uint) -> Code;
        fn hipStreamGetPriority(stream: hipStream_t, priority: *mut c_int) -> Code;
        fn hipStreamQuery(stream: hipStream_t) -> Code;
        fn hipStreamSynchronize(stream: hipStream_t) -> Code;
        fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> Code;
        fn hipStreamAddCallback(
            stream: hipStream_t,
            callback: StreamCallbackFn,
            data: *mut c_void,
            flags: c_uint
        ) -> Code;

        fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Code;
        fn hipEventDestroy(event: hipEvent_t) -> Code;
        fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Code;
        fn hipEventQuery(event: hipEvent_t) -> Code;
        fn hipEventSynchronize(event: hipEvent_t) -> Code;
        fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, end: hipEvent_t) -> Code;

        fn hipMemGetAllocationGranularity(granularity: *mut usize, prop: *const c_void, option: c_uint) -> Code;
        fn hipMemAddressReserve(
            ptr: *mut *mut c_void,
            size: usize,
            alignment: usize,
            addr: *mut c_void,
            flags: c_ulonglong
        ) -> Code;
        fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> Code;
        fn hipMemCreate(handle: *mut *mut c_void, size: usize, prop: *const c_void, flags: c_ulonglong) -> Code;
        fn hipMemRelease(handle: *mut c_void) -> Code;
        fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: *mut c_void, flags: c_ulonglong) -> Code;
        fn hipMemSetAccess(ptr: *mut c_void, size: usize, desc: *const hipMemAccessDesc, count: usize) -> Code;
        fn hipMemUnmap(ptr: *mut c_void, size: usize) -> Code;
    }
}

/// What an entry point answers before the library is loaded.
trait NotLoaded {
    /// The answer.
    const NOT_LOADED: Self;
}

impl NotLoaded for Code {
    /// `hipErrorNotInitialized`.
    const NOT_LOADED: Code = hipError_t::hipErrorNotInitialized as Code;
}

impl NotLoaded for *const c_char {
    /// No name: [`describe`] falls back to the number.
    const NOT_LOADED: *const c_char = std::ptr::null();
}

/// The loaded runtime: the library (kept loaded for the rest of the process), where it was
/// found, and its entry points.
struct Loaded {
    /// Never used after loading, but dropping it would unload the code the table points into.
    _library: libloading::Library,
    path: PathBuf,
    functions: sys::Functions,
}

/// Why the runtime library could not be used; kept so every later call reports the same error.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LoadFailure {
    /// No candidate could be loaded: the candidates and the loader's message for the last one.
    NoLibrary { tried: Vec<PathBuf>, last: String },
    /// The library found lacks an entry point.
    MissingSymbol { path: PathBuf, symbol: &'static str },
}

impl LoadFailure {
    /// The error every call reports after this failure.
    fn to_error(&self) -> Error {
        let detail = match self {
            LoadFailure::NoLibrary { tried, last } => format!(
                "the HIP runtime library (libamdhip64) could not be loaded; tried {} (last error: {last}). \
                 Install the HIP runtime (ROCm, or on Debian and Ubuntu `apt-get install libamdhip64-5`) \
                 and set HIP_PATH to its root (the folder whose lib/ holds libamdhip64.so) or add that \
                 lib folder to LD_LIBRARY_PATH; on a machine without an AMD GPU, run on the CPU instead: \
                 build with gpumem's `auto` feature beside `hip` (features = [\"hip\", \"auto\"]): such a \
                 build falls back to the host backend by itself, and GPUMEM_BACKEND=host forces it; \
                 or name gpumem::host::Host",
                tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
            LoadFailure::MissingSymbol { path, symbol } => format!(
                "{} does not export {symbol}: gpumem needs the HIP runtime of ROCm 5.2 or newer; \
                 update it, or point HIP_PATH at a newer install",
                path.display()
            ),
        };
        Error::DriverNotFound { backend: BACKEND, detail }
    }
}

/// The library names tried, in order: each under `$HIP_PATH/lib` when HIP_PATH is set, then
/// each through the dynamic loader's search path (LD_LIBRARY_PATH, the system's folders).
/// `libamdhip64.so` is the development link, which a runtime-only install lacks; ROCm 5 ships
/// `.so.5` and ROCm 6 `.so.6`.
fn candidates(hip_path: Option<&OsStr>) -> Vec<PathBuf> {
    const NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];
    let mut out = Vec::new();
    if let Some(root) = hip_path.filter(|r| !r.is_empty()) {
        out.extend(NAMES.iter().map(|n| Path::new(root).join("lib").join(n)));
    }
    out.extend(NAMES.iter().map(PathBuf::from));
    out
}

/// Loads the first candidate that loads, then resolves every entry point from it.
fn load_from(candidates: &[PathBuf]) -> std::result::Result<Loaded, LoadFailure> {
    let mut last = String::from("no candidate");
    for path in candidates {
        // SAFETY: loading runs the library's initialisers, as linking it would; a HIP runtime's
        // initialisers only set up its own state.
        match unsafe { libloading::Library::new(path) } {
            Ok(library) => {
                // SAFETY: a library named libamdhip64 is the HIP runtime, whose entry points have
                // HIP 5.2's signatures (unchanged through ROCm 6 for those called here); it is
                // kept in `Loaded` with the table.
                return match unsafe { sys::Functions::resolve(&library) } {
                    Ok(functions) => Ok(Loaded { _library: library, path: path.clone(), functions }),
                    Err(symbol) => Err(LoadFailure::MissingSymbol { path: path.clone(), symbol }),
                };
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(LoadFailure::NoLibrary { tried: candidates.to_vec(), last })
}

/// The library, once loading has been tried: loaded once per process by [`library`].
static LOADED: OnceLock<std::result::Result<Loaded, LoadFailure>> = OnceLock::new();

/// The entry points, once the library is loaded; `None` before (or without) it. Never loads:
/// calls reach this after [`init`] loaded it, and answer `NOT_LOADED` otherwise.
#[inline]
fn functions() -> Option<&'static sys::Functions> {
    match LOADED.get() {
        Some(Ok(loaded)) => Some(&loaded.functions),
        _ => None,
    }
}

/// Loads the HIP runtime and resolves every entry point in [`sys::SYMBOLS`], once per process; every
/// later call gives the first call's answer. Returns where the library was found.
///
/// # Errors
///
/// `DriverNotFound` when no libamdhip64 loads, or the one found lacks an entry point.
pub(crate) fn library() -> Result<&'static Path> {
    let state = LOADED.get_or_init(|| load_from(&candidates(std::env::var_os("HIP_PATH").as_deref())));
    match state {
        Ok(loaded) => Ok(&loaded.path),
        Err(failure) => Err(failure.to_error()),
    }
}

/// What the runtime said the first time it was asked for its devices: the count, or the code
/// of the failure (`hipErrorNoDevice` also for a count of zero). `Error` is not `Clone`, so the
/// code is kept and the error rebuilt for every caller.
static RUNTIME: OnceLock<std::result::Result<usize, Code>> = OnceLock::new();

/// Asks the runtime for its devices once per process; every later call gives the first call's
/// answer. Every operation passes here (through `device::make_current`, or directly) before its first
/// other HIP call, so a machine without a device gets `NoDevice` from each of them rather than a
/// different error per API (HIP 5.2 answers `hipErrorInvalidDevice` to most calls there).
///
/// It loads the library first ([`library`]), as the CUDA backend loads libcuda. Differs from
/// the CUDA backend: HIP has no `cuInit`, the runtime initialises itself on its first call, and
/// `hipGetDeviceCount` is the call that reports what it found; so this check also yields the
/// device count.
///
/// # Errors
///
/// `DriverNotFound` when the library cannot be loaded or lacks an entry point; `NoDevice` when
/// the runtime finds no device; the runtime's error from `hipGetDeviceCount`.
pub(crate) fn init() -> Result<usize> {
    library()?;
    let state = RUNTIME.get_or_init(|| {
        let mut count = 0;
        // SAFETY: an out-pointer to a local `c_int`.
        match unsafe { sys::hipGetDeviceCount(&mut count) } {
            SUCCESS => usize::try_from(count).ok().filter(|&n| n > 0).ok_or(ERROR_NO_DEVICE),
            code => Err(code),
        }
    });
    state.map_err(|code| error("hipGetDeviceCount", code))
}

/// `Ok(())` for `hipSuccess`, else the mapped error of `api`.
///
/// # Errors
///
/// The mapped error (see [`error`]).
#[inline]
pub(crate) fn check(api: &'static str, code: Code) -> Result<()> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(error(api, code))
    }
}

/// As [`check`], for an allocation of `size` bytes: `hipErrorOutOfMemory` becomes
/// [`Error::OutOfMemory`] with `total: None`, so the pool's retry ladder runs.
///
/// # Errors
///
/// `OutOfMemory`, or the mapped error.
#[inline]
pub(crate) fn check_alloc(api: &'static str, code: Code, size: usize) -> Result<()> {
    match code {
        SUCCESS => Ok(()),
        ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory { size, total: None }),
        _ => Err(error(api, code)),
    }
}

/// The error for a failed call of `api`: `NoDevice` for `hipErrorNoDevice`, otherwise
/// [`Error::Backend`] with the code and the runtime's own name and description of it.
///
/// It serves stream callbacks too: `hipGetErrorName` and `hipGetErrorString` only look the code
/// up (in 5.2's library each is one jump into the same `switch`; they take no lock and touch no
/// queue).
pub(crate) fn error(api: &'static str, code: Code) -> Error {
    if code == ERROR_NO_DEVICE {
        return Error::NoDevice { backend: BACKEND };
    }
    let (name, message) = describe(code);
    Error::backend(BACKEND, api, i64::from(code), name, message)
}

/// [`Error::Unsupported`] for an operation this backend does not offer: stream capture, and
/// `malloc_async` on a device without memory pools.
pub(crate) fn unsupported(operation: &'static str) -> Error {
    Error::Unsupported { operation, backend: BACKEND }
}

/// The runtime's name and description of a code, from `hipGetErrorName` and
/// `hipGetErrorString`. A code the runtime does not know gets its own answer for that
/// (`hipErrorUnknown` in HIP 5.2, whose `hipGetErrorString` also gives the name, not a sentence).
fn describe(code: Code) -> (String, String) {
    let text = |ptr: *const c_char| -> String {
        if ptr.is_null() {
            return format!("hipError_t {code}");
        }
        // SAFETY: a non-null pointer from hipGetErrorName/String points to a static
        // NUL-terminated string owned by the library, which stays loaded.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    };
    // SAFETY: both functions take any integer and return a pointer to a static string (or
    // null, handled above); they touch no other state.
    let (name, message) = unsafe { (sys::hipGetErrorName(code), sys::hipGetErrorString(code)) };
    (text(name), text(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `sys::hip...(` call in the crate's sources is an entry point in [`sys::SYMBOLS`]
    /// (else it would not compile: each is declared by the same list), and every entry point in
    /// the list is called somewhere, so loading probes exactly what this crate may call.
    #[test]
    fn symbols_match_the_runtime_calls() {
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
        let mut called: Vec<&str> = Vec::new();
        for source in sources {
            for (i, _) in source.match_indices("sys::hip") {
                let rest = &source[i + "sys::".len()..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                let (name, after) = rest.split_at(end);
                if after.starts_with('(') {
                    assert!(sys::SYMBOLS.contains(&name), "{name} is called but missing from SYMBOLS");
                    called.push(name);
                }
            }
        }
        for symbol in sys::SYMBOLS {
            assert!(called.contains(symbol), "{symbol} is probed at load time but never called");
        }
        assert_eq!(sys::SYMBOLS.len(), 51, "the list changed: update this count with it");
    }

    #[test]
    fn the_installed_runtime_exports_every_entry_point() {
        // The CI jobs that build this crate install Debian's libamdhip64 (HIP 5.2.3).
        let path = library().expect("the HIP runtime library loads and exports every entry point");
        assert!(path.to_string_lossy().contains("libamdhip64"), "{}", path.display());
    }

    #[test]
    fn candidates_try_hip_path_first_then_the_search_path() {
        let with = candidates(Some(OsStr::new("/opt/rocm-6.1")));
        let names: Vec<String> = with.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            names,
            [
                "/opt/rocm-6.1/lib/libamdhip64.so",
                "/opt/rocm-6.1/lib/libamdhip64.so.6",
                "/opt/rocm-6.1/lib/libamdhip64.so.5",
                "libamdhip64.so",
                "libamdhip64.so.6",
                "libamdhip64.so.5",
            ]
        );
        assert_eq!(candidates(None), candidates(Some(OsStr::new(""))));
        assert_eq!(candidates(None).len(), 3);
    }

    #[test]
    fn a_missing_library_is_driver_not_found_saying_what_to_install() {
        let tried = [PathBuf::from("/nonexistent/lib/libamdhip64.so"), PathBuf::from("libamdhip64.so.99")];
        let failure = match load_from(&tried) {
            Err(failure) => failure,
            Ok(_) => panic!("loaded a library that does not exist"),
        };
        assert!(matches!(&failure, LoadFailure::NoLibrary { tried: t, .. } if t.len() == 2));
        match failure.to_error() {
            Error::DriverNotFound { backend: "hip", detail } => {
                assert!(detail.contains("/nonexistent/lib/libamdhip64.so, libamdhip64.so.99"), "{detail}");
                assert!(detail.contains("HIP_PATH") && detail.contains("libamdhip64-5"), "{detail}");
                assert!(detail.contains("\"auto\"") && detail.contains("GPUMEM_BACKEND=host"), "{detail}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_library_without_the_entry_points_is_driver_not_found_naming_the_first() {
        // Any shared library that is not HIP's: the C math library.
        let failure = match load_from(&[PathBuf::from("libm.so.6")]) {
            Err(failure) => failure,
            Ok(_) => panic!("libm passed for the HIP runtime"),
        };
        assert_eq!(
            failure,
            LoadFailure::MissingSymbol { path: PathBuf::from("libm.so.6"), symbol: sys::SYMBOLS[0] }
        );
        let e = failure.to_error();
        assert!(matches!(e, Error::DriverNotFound { backend: "hip", .. }));
        assert!(e.to_string().contains("libm.so.6 does not export hipGetErrorName"), "{e}");
    }

    #[test]
    fn success_is_ok_and_no_device_maps_without_the_runtime() {
        assert!(check("hipGetDeviceCount", SUCCESS).is_ok());
        assert!(matches!(
            check("hipGetDeviceCount", ERROR_NO_DEVICE),
            Err(Error::NoDevice { backend: "hip" })
        ));
        assert!(matches!(
            check_alloc("hipMalloc", ERROR_OUT_OF_MEMORY, 4096),
            Err(Error::OutOfMemory { size: 4096, total: None })
        ));
        assert!(check_alloc("hipMalloc", SUCCESS, 4096).is_ok());
    }

    #[test]
    fn backend_errors_carry_code_name_and_text() {
        // The runtime names its codes: load it, as every operation does first.
        library().expect("these tests need the HIP runtime library installed");
        match error("hipMemcpy", ERROR_INVALID_VALUE) {
            Error::Backend { backend, api, code, name, message } => {
                assert_eq!((backend, api, code), ("hip", "hipMemcpy", 1));
                assert_eq!(name, "hipErrorInvalidValue");
                assert!(!message.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        // A plain out-of-memory outside an allocation is a backend error like any other.
        assert_eq!(error("hipMemcpy", ERROR_OUT_OF_MEMORY).code(), Some(2));
    }

    #[test]
    fn codes_hip_sys_does_not_list_are_read_soundly() {
        library().expect("these tests need the HIP runtime library installed");
        // Not a variant of hip-sys's `hipError_t`: through its declarations this value could not
        // even be received. Here it is an integer, and the runtime names it itself.
        match error("hipStreamQuery", 123_456) {
            Error::Backend { code, name, message, .. } => {
                assert_eq!(code, 123_456);
                assert!(!name.is_empty() && !message.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unsupported_names_the_operation_and_the_backend() {
        let e = unsupported("begin_capture");
        assert!(matches!(e, Error::Unsupported { operation: "begin_capture", backend: "hip" }));
        assert_eq!(e.to_string(), "begin_capture is not supported on the hip backend");
    }
}
