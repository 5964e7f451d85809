//! The driver entry points this crate calls, declared here with the C signatures of `cuda.h` and
//! integer results, and resolved by name from libcuda with `libloading` the first time the driver
//! is started.
//!
//! gpumem does not call through cudarc's generated bindings, for two reasons. cudarc types
//! `CUresult` and every enum parameter as a Rust enum, so a code a driver newer than the bindings
//! returns (`CUDA_ERROR_CONTAINED`, 226, is missing from the 12.0 bindings) is undefined
//! behaviour the moment it is received; here every status is a `c_int` and every enum parameter a
//! `c_int`/`c_uint`. And the bindings change with cudarc's `cuda-XXXXX` version feature (a newer
//! one names `_v2`/`_v3` entry points older drivers lack), which an application that also uses
//! cudarc picks for the whole build; gpumem's own calls do not depend on it.
//!
//! The library is opened under the driver's names (`libcuda.so.1`, then `libcuda.so`; `nvcuda.dll`
//! on Windows), the same library cudarc opens: the dynamic loader hands both the one copy already
//! loaded in the process. It is never closed. Every entry point declared here is exported by
//! every driver from CUDA 12.0 on, under the plain (not `_ptsz`) name, which is also the name
//! cudarc's dynamic loading uses.
//!
//! The handle types are public, since [`CudaStream`](crate::CudaStream) and the other handles give
//! out raw values of them; the entry points are this crate's own. To hand a handle to another
//! binding of the driver (cudarc's, say), cast the pointer: both name the same driver object.
//!
//! A call made before the table is loaded returns `CUDA_ERROR_NOT_INITIALIZED` instead of
//! panicking; the crate loads it before any other call.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::{c_char, c_float, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

/// A driver status (`CUresult`, a C enum): always an integer here, never a Rust enum.
pub type CUresult = c_int;
/// A device ordinal handle (`CUdevice`).
pub type CUdevice = c_int;
/// A device address (`CUdeviceptr`, 64-bit on 64-bit hosts).
pub type CUdeviceptr = c_ulonglong;

/// Opaque driver objects, only ever handled by pointer.
macro_rules! opaque {
    ($($name:ident => $ptr:ident),* $(,)?) => {$(
        #[doc = concat!("The driver's opaque `", stringify!($name), "`.")]
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
        #[doc = concat!("A handle to a `", stringify!($name), "`.")]
        pub type $ptr = *mut $name;
    )*};
}
opaque! {
    CUctx_st => CUcontext,
    CUstream_st => CUstream,
    CUevent_st => CUevent,
    CUgraph_st => CUgraph,
    CUgraphExec_st => CUgraphExec,
    CUmemPoolHandle_st => CUmemoryPool,
}

/// `CUhostFn`.
pub(crate) type CUhostFn = Option<unsafe extern "C" fn(data: *mut c_void)>;
/// `CUstreamCallback`: the status argument is the integer `CUresult`.
pub(crate) type CUstreamCallback =
    Option<unsafe extern "C" fn(stream: CUstream, status: CUresult, data: *mut c_void)>;

// Enum values of `cuda.h` used as arguments, as the integers the C enums are.
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub(crate) const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`.
pub(crate) const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`.
pub(crate) const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
pub(crate) const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CU_MEMHOSTALLOC_PORTABLE`.
pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;
/// `CU_STREAM_DEFAULT`.
pub(crate) const CU_STREAM_DEFAULT: c_uint = 0;
/// `CU_STREAM_NON_BLOCKING`.
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub(crate) const CU_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
pub(crate) const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub(crate) const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_HANDLE_TYPE_NONE`.
pub(crate) const CU_MEM_HANDLE_TYPE_NONE: c_int = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub(crate) const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_int = 1;

/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = c_ulonglong;

/// `CUmemLocation` (12.x layout: the location type and an ordinal).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUmemLocation {
    pub(crate) type_: c_int,
    pub(crate) id: c_int,
}

/// `CUmemAllocationProp`'s `allocFlags`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUmemAllocFlags {
    pub(crate) compressionType: u8,
    pub(crate) gpuDirectRDMACapable: u8,
    pub(crate) usage: u16,
    pub(crate) reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
pub(crate) struct CUmemAllocationProp {
    pub(crate) type_: c_int,
    pub(crate) requestedHandleTypes: c_int,
    pub(crate) location: CUmemLocation,
    pub(crate) win32HandleMetaData: *mut c_void,
    pub(crate) allocFlags: CUmemAllocFlags,
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub(crate) struct CUmemAccessDesc {
    pub(crate) location: CUmemLocation,
    pub(crate) flags: c_int,
}

/// `CUDA_ERROR_NOT_INITIALIZED`: what a call answers before the table is loaded.
const NOT_INITIALIZED: CUresult = 3;

/// Declares the entry points: the table of function pointers, its loader, [`SYMBOLS`], and one
/// `unsafe fn` per entry point that calls through the table.
macro_rules! driver_api {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?); )*) => {
        /// The resolved entry points.
        struct Table {
            $( $name: unsafe extern "C" fn($($ty),*) -> CUresult, )*
        }

        /// Every driver entry point this crate calls, by its exported name: the table's fields,
        /// each resolved when the driver is started (so an old driver is an error there, not
        /// later). A unit test keeps it in step with the calls in the source.
        #[cfg(test)]
        pub(crate) const SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        impl Table {
            /// Resolves every entry point, or names the first one the library lacks.
            fn load(lib: &libloading::Library) -> Result<Table, &'static str> {
                Ok(Table {
                    $(
                        // SAFETY: the symbol is read as the C signature `cuda.h` declares for it
                        // (with integer enums, which have the C enums' size); copying the function
                        // pointer out is sound because the library is never unloaded.
                        $name: unsafe {
                            *lib.get::<unsafe extern "C" fn($($ty),*) -> CUresult>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|_| stringify!($name))?
                        },
                    )*
                })
            }
        }

        $(
            #[doc = concat!("`", stringify!($name), "` of the driver API, as `cuda.h` declares it.")]
            ///
            /// # Safety
            ///
            /// The driver API's own preconditions for this call (valid handles and pointers).
            #[inline]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
                match TABLE.get() {
                    // SAFETY: the pointer was resolved under this name with this signature; the
                    // caller upholds the driver's preconditions.
                    Some(Ok(table)) => unsafe { (table.$name)($($arg),*) },
                    _ => NOT_INITIALIZED,
                }
            }
        )*
    };
}

driver_api! {
    fn cuInit(flags: c_uint);
    fn cuGetErrorName(error: CUresult, text: *mut *const c_char);
    fn cuGetErrorString(error: CUresult, text: *mut *const c_char);
    // devices and contexts
    fn cuDeviceGetCount(count: *mut c_int);
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, dev: CUdevice);
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
    fn cuCtxSetCurrent(ctx: CUcontext);
    fn cuCtxGetCurrent(ctx: *mut CUcontext);
    fn cuCtxSynchronize();
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice);
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr);
    // memory
    fn cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize);
    fn cuMemFree_v2(ptr: CUdeviceptr);
    fn cuMemHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint);
    fn cuMemFreeHost(ptr: *mut c_void);
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attribute: c_int, value: *mut c_void);
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attribute: c_int, value: *mut c_void);
    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize);
    fn cuMemAllocAsync(ptr: *mut CUdeviceptr, size: usize, stream: CUstream);
    fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream);
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, size: usize);
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, size: usize, stream: CUstream);
    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize);
    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream);
    // virtual memory
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int);
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong);
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong);
    fn cuMemRelease(handle: CUmemGenericAllocationHandle);
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong);
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize);
    // streams, capture and graphs
    fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int);
    fn cuStreamDestroy_v2(stream: CUstream);
    fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint);
    fn cuStreamGetPriority(stream: CUstream, priority: *mut c_int);
    fn cuStreamQuery(stream: CUstream);
    fn cuStreamSynchronize(stream: CUstream);
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    fn cuLaunchHostFunc(stream: CUstream, func: CUhostFn, data: *mut c_void);
    fn cuStreamAddCallback(stream: CUstream, callback: CUstreamCallback, data: *mut c_void, flags: c_uint);
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int);
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph);
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint);
    fn cuStreamGetCaptureInfo_v2(
        stream: CUstream,
        status: *mut c_uint,
        id: *mut u64,
        graph: *mut CUgraph,
        dependencies: *mut *const c_void,
        n_dependencies: *mut usize,
    );
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong);
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    fn cuGraphUpload(exec: CUgraphExec, stream: CUstream);
    fn cuGraphExecDestroy(exec: CUgraphExec);
    fn cuGraphDestroy(graph: CUgraph);
    fn cuGraphDebugDotPrint(graph: CUgraph, path: *const c_char, flags: c_uint);
    // events
    fn cuEventCreate(event: *mut CUevent, flags: c_uint);
    fn cuEventDestroy_v2(event: CUevent);
    fn cuEventRecord(event: CUevent, stream: CUstream);
    fn cuEventQuery(event: CUevent);
    fn cuEventSynchronize(event: CUevent);
    fn cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent);
}

/// The names the driver library is opened under, in order: the driver's soname first (the
/// toolkit's link stub is called `libcuda.so`, so it is tried only after the real driver).
pub(crate) const LIBRARY_NAMES: &[&str] =
    if cfg!(windows) { &["nvcuda.dll"] } else { &["libcuda.so.1", "libcuda.so"] };

/// The driver library, opened once per process and never closed.
fn library() -> Option<&'static libloading::Library> {
    static LIBRARY: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            LIBRARY_NAMES.iter().find_map(|name| {
                // SAFETY: opening the driver library runs its initialisers, as linking a program
                // to libcuda does; nothing in it is called here.
                unsafe { libloading::Library::new(*name) }.ok()
            })
        })
        .as_ref()
}

/// The table, once loaded; the error names the first entry point missing.
static TABLE: OnceLock<Result<Table, LoadError>> = OnceLock::new();

/// Why the table could not be loaded.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LoadError {
    /// No driver library could be opened.
    NoLibrary,
    /// The library lacks this entry point.
    MissingSymbol(&'static str),
}

/// Whether the driver library can be opened.
pub(crate) fn library_present() -> bool {
    library().is_some()
}

/// Opens the library and resolves every entry point, once per process.
///
/// # Errors
///
/// No library, or the first entry point it lacks.
pub(crate) fn load() -> Result<(), LoadError> {
    match TABLE.get_or_init(|| {
        library()
            .ok_or(LoadError::NoLibrary)
            .and_then(|lib| Table::load(lib).map_err(LoadError::MissingSymbol))
    }) {
        Ok(_) => Ok(()),
        Err(e) => Err(*e),
    }
}
