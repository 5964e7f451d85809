//! The checked-call layer: the HIP functions this backend calls, declared so that every code
//! the runtime returns is read soundly; the mapping from HIP's codes to gpumem's errors; and the
//! once-only runtime check every operation starts from.
//!
//! The CUDA backend calls cudarc's `sys` and `result` layers. hip-sys has only the raw layer,
//! and its function declarations return `hipError_t` as a Rust `enum` (bindgen's rustified,
//! `#[repr(u32)]` enum, generated from HIP 5.4's headers). Receiving a value that enum does not
//! list (a code added by a newer runtime, or anything a vendor patch returns) would be undefined
//! behaviour in Rust, however the code is handled afterwards. So [`sys`] declares the functions
//! this backend calls again, with the code as a plain `u32` (the C enum's underlying type, as
//! bindgen itself chose it), and hip-sys supplies the handle types, the argument enums (sound to
//! pass *to* C: gpumem only builds listed variants), the flag constants, and the link to
//! `libamdhip64` (its build script).

use std::ffi::{c_char, CStr};
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
/// `hipErrorPeerAccessAlreadyEnabled`.
pub(crate) const ERROR_PEER_ACCESS_ALREADY_ENABLED: Code =
    hipError_t::hipErrorPeerAccessAlreadyEnabled as Code;

/// The HIP runtime functions this backend calls, with integer status codes (see the
/// module docs). Every other type comes from hip-sys. The declarations follow HIP 5.2's
/// `hip_runtime_api.h`, and Debian's `libamdhip64` 5.2.3 exports each function (linking any
/// program of this crate checks that).
pub(crate) mod sys {
    use std::ffi::{c_char, c_int, c_uint, c_void};

    use hip_sys::hiprt::{
        hipDeviceAttribute_t, hipEvent_t, hipMemPoolAttr, hipMemPool_t, hipMemcpyKind, hipStream_t,
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

    // No `#[link]` here: hip-sys's build script (hip-runtime-sys) links `amdhip64` for the
    // whole dependency graph, from `$HIP_PATH/lib` or the system's library path.
    extern "C" {
        pub(crate) fn hipGetErrorName(code: Code) -> *const c_char;
        pub(crate) fn hipGetErrorString(code: Code) -> *const c_char;
        pub(crate) fn hipGetLastError() -> Code;
        pub(crate) fn hipRuntimeGetVersion(version: *mut c_int) -> Code;

        pub(crate) fn hipGetDeviceCount(count: *mut c_int) -> Code;
        pub(crate) fn hipSetDevice(device: c_int) -> Code;
        pub(crate) fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> Code;
        pub(crate) fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> Code;
        pub(crate) fn hipDeviceGetAttribute(
            value: *mut c_int,
            attr: hipDeviceAttribute_t,
            device: c_int,
        ) -> Code;
        pub(crate) fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> Code;
        pub(crate) fn hipDeviceSynchronize() -> Code;
        pub(crate) fn hipDeviceCanAccessPeer(can_access: *mut c_int, device: c_int, peer: c_int) -> Code;
        pub(crate) fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> Code;
        pub(crate) fn hipPointerGetAttributes(attributes: *mut PointerAttributes, ptr: *const c_void)
            -> Code;

        pub(crate) fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Code;
        pub(crate) fn hipFree(ptr: *mut c_void) -> Code;
        pub(crate) fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Code;
        pub(crate) fn hipHostFree(ptr: *mut c_void) -> Code;
        pub(crate) fn hipDeviceGetDefaultMemPool(pool: *mut hipMemPool_t, device: c_int) -> Code;
        pub(crate) fn hipMemPoolSetAttribute(
            pool: hipMemPool_t,
            attr: hipMemPoolAttr,
            value: *mut c_void,
        ) -> Code;
        pub(crate) fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: hipStream_t) -> Code;
        pub(crate) fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> Code;
        pub(crate) fn hipMemcpy(
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
            kind: hipMemcpyKind,
        ) -> Code;
        pub(crate) fn hipMemcpyAsync(
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
            kind: hipMemcpyKind,
            stream: hipStream_t,
        ) -> Code;
        pub(crate) fn hipMemset(dst: *mut c_void, value: c_int, size: usize) -> Code;
        pub(crate) fn hipMemsetAsync(
            dst: *mut c_void,
            value: c_int,
            size: usize,
            stream: hipStream_t,
        ) -> Code;

        pub(crate) fn hipDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> Code;
        pub(crate) fn hipStreamCreateWithPriority(
            stream: *mut hipStream_t,
            flags: c_uint,
            priority: c_int,
        ) -> Code;
        pub(crate) fn hipStreamDestroy(stream: hipStream_t) -> Code;
        pub(crate) fn hipStreamGetFlags(stream: hipStream_t, flags: *mut c_uint) -> Code;
        pub(crate) fn hipStreamGetPriority(stream: hipStream_t, priority: *mut c_int) -> Code;
        pub(crate) fn hipStreamQuery(stream: hipStream_t) -> Code;
        pub(crate) fn hipStreamSynchronize(stream: hipStream_t) -> Code;
        pub(crate) fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> Code;
        pub(crate) fn hipStreamAddCallback(
            stream: hipStream_t,
            callback: StreamCallbackFn,
            data: *mut c_void,
            flags: c_uint,
        ) -> Code;

        pub(crate) fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Code;
        pub(crate) fn hipEventDestroy(event: hipEvent_t) -> Code;
        pub(crate) fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Code;
        pub(crate) fn hipEventQuery(event: hipEvent_t) -> Code;
        pub(crate) fn hipEventSynchronize(event: hipEvent_t) -> Code;
        pub(crate) fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, end: hipEvent_t) -> Code;
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
/// Differs from the CUDA backend: HIP has no `cuInit`, the runtime initialises itself on its
/// first call, and `hipGetDeviceCount` is the call that reports what it found; so this check
/// also yields the device count. Nor is there a library to load: the dynamic linker loaded
/// `libamdhip64` before `main` (see the crate docs), so a missing library never reaches here.
///
/// # Errors
///
/// `NoDevice` when the runtime finds no device; the runtime's error from `hipGetDeviceCount`.
pub(crate) fn init() -> Result<usize> {
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
