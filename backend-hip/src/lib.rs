//! gpumem's HIP backend: [`Hip`] implements [`gpumem_core::Backend`] on the HIP runtime
//! (`libamdhip64`), for AMD GPUs.
//!
//! It translates each backend operation into one runtime call (or a few), following the contract
//! in [`gpumem_core::backend`]: it validates nothing the typed layer already checked, keeps no
//! pool of its own, and never panics. Its files mirror the CUDA backend's, item for item, so the
//! two read side by side; every place where HIP makes this backend differ says so where it
//! happens.
//!
//! # The runtime and hip-sys
//!
//! The runtime is reached through [hip-sys]'s raw bindings (`hip_sys::hiprt`, generated from HIP
//! 5.4's headers) with this crate's own thin checked-call layer (`result.rs`). hip-sys types
//! every status code as a Rust enum, and receiving a value it does not list would be undefined
//! behaviour, so `result.rs` declares the functions this crate calls again with the code as a
//! plain integer; hip-sys supplies the handle types, the argument enums and constants, and the
//! link to the library.
//!
//! hip-sys's build script links `amdhip64` at link time. It looks for
//! `include/hip/hip_runtime_api.h` under `hipconfig -p`, `$HIP_PATH`, `$ROCM_PATH`, `/opt/rocm`
//! and `/opt/rocm/hip`, fails the build when none has it, and adds `$HIP_PATH/lib` to the
//! library path. On Debian 12, `libamdhip64-dev` (HIP 5.2.3) installs both under `/usr`:
//!
//! ```text
//! apt-get install -y libamdhip64-dev
//! HIP_PATH=/usr cargo build -p gpumem-hip
//! ```
//!
//! # A missing runtime library
//!
//! Differs from the CUDA backend, which loads libcuda at run time: because `libamdhip64` is
//! linked, a program built with this backend needs `libamdhip64.so.5` to start at all. Without it
//! the dynamic loader stops the program before `main` ("error while loading shared libraries"),
//! so this backend never returns [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound).
//! (Loading the library at run time would mean resolving every function through `dlopen`, with
//! hip-sys kept for its types while its build script still requires the headers; gpumem does not
//! do that.) What the library itself reports is mapped in full: on a machine with the library
//! but no AMD GPU (no `/dev/kfd`), `hipGetDeviceCount` answers `hipErrorNoDevice`, and every
//! operation of this backend that would call the runtime then returns
//! [`Error::NoDevice`](gpumem_core::Error::NoDevice) (the capture operations, which never call
//! it, stay `Unsupported`).
//!
//! # Errors
//!
//! Codes are handled as integers. `hipErrorOutOfMemory` from an allocation (`hipMalloc`,
//! `hipHostMalloc`, `hipMallocAsync`) is [`Error::OutOfMemory`](gpumem_core::Error::OutOfMemory)
//! with `total: None`; `hipErrorNoDevice`, or a device count of 0, is `NoDevice`; `malloc_async`
//! on a device without memory pools and every capture operation are
//! [`Error::Unsupported`](gpumem_core::Error::Unsupported); every other failure is
//! [`Error::Backend`](gpumem_core::Error::Backend) with the function's name, the numeric code,
//! and the runtime's name and text for it (`hipGetErrorName`, `hipGetErrorString`).
//!
//! # Devices
//!
//! HIP has one implicit context per device, selected per thread with `hipSetDevice`. Every
//! operation takes the device it runs on and makes it current on the calling thread, calling
//! `hipSetDevice` only when a thread-local cache says another device is current. Code outside
//! gpumem that calls `hipSetDevice` behind its back should make a device current again with
//! `Device::use_device`, which always calls `hipSetDevice`.
//!
//! # The associated types
//!
//! - `Stream` is [`HipStream`], a `Copy` handle (`hipStream_t`). The raw value 0 is the null
//!   stream, which is also the legacy stream (HIP 5.2 has no `hipStreamLegacy`; see
//!   [`HipStream::LEGACY`]), and 2 is `hipStreamPerThread`. A raw value of 1 is read as the
//!   legacy stream.
//! - `Event` is [`HipEvent`], an owned `hipEvent_t`.
//! - `Graph` is [`HipGraph`], a type without values: this backend offers no capture.
//!
//! # What HIP 5.2 lacks, and what this backend does instead
//!
//! - **Stream capture and graphs**: not offered. `begin_capture`, `end_capture`,
//!   `capture_status`, `graph_launch`, `graph_upload` and `graph_destroy` return
//!   `Error::Unsupported { operation, backend: "hip" }` without calling the runtime. HIP 5.2's
//!   graph API is beta, and its library exports neither `hipGraphUpload` nor
//!   `hipLaunchHostFunc` (which capturing a host function needs); CuPy skips its graph tests on
//!   HIP. The typed layer reads `capture_status`'s answer as "not capturing" before transfers,
//!   as CuPy skips its capture checks on HIP.
//! - **`hipLaunchHostFunc`**: declared in 5.2's headers but not exported by its library. Host
//!   functions go through `hipStreamAddCallback`, which runs them once the work before them is
//!   done and holds later work until they return.
//! - **Legacy stream handle**: none; the null stream is the legacy stream.
//! - **Per-thread default stream**: `hipStreamPerThread` (2) exists in 5.2 and is used as is.
//! - **Stream-ordered allocator**: `hipMallocAsync` exists (beta in 5.2). Where the device
//!   reports no memory pools (or the runtime does not know the attribute), `malloc_async` is
//!   `Unsupported`; otherwise the default pool's release threshold is raised on first use, as on
//!   CUDA.
//! - **Priorities**: `hipStreamCreateWithPriority` and `hipDeviceGetStreamPriorityRange` exist;
//!   HIP 5.2 (hipamd) has three levels and reports the range as (1, -1).
//! - **Flags of the null stream**: HIP refuses the question (`hipErrorInvalidValue`); the default
//!   flags are answered without asking, as CUDA would answer.
//! - **Pointer attributes**: HIP 5 answers `hipErrorInvalidValue` for plain host memory, read as
//!   "no device"; the memory type is read as an integer with the numbering of the runtime's
//!   major version (ROCm 6 renumbered it).
//! - **Device properties**: read attribute by attribute, as on CUDA; attributes a runtime does
//!   not know get a documented default.
//!
//! # Operations worth knowing
//!
//! - Synchronous copies and memsets (`hipMemcpy` with `hipMemcpyDefault`, `hipMemset`) run on
//!   the null stream, as CuPy's do, and then wait for it, as the CUDA backend does.
//! - Peer access: `hipErrorPeerAccessAlreadyEnabled` is success, and the thread's last error it
//!   leaves behind is cleared.
//! - One-shot callbacks go through `hipStreamAddCallback` and a trampoline that never unwinds.
//!
//! # Tests
//!
//! `tests/hip.rs` runs wherever the library is installed. Without an AMD GPU it checks the
//! no-device answers and the unsupported capture operations; the tests that need a GPU are
//! ignored with the reason, and fail, rather than skip, when run with `--include-ignored` where
//! no device is found. None of them has run on AMD hardware yet.
//!
//! [hip-sys]: https://crates.io/crates/hip-sys

// ROCm runs on 64-bit hosts only, and this crate converts between gpumem's `usize` addresses and
// HIP's pointers with plain casts.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("gpumem-hip needs a 64-bit target");

mod device;
mod event;
mod memory;
mod result;
mod stream;

use std::ffi::c_void;

use gpumem_core::{
    Backend, CaptureMode, CaptureStatus, DeviceId, DeviceProperties, DevicePtr, EventFlags, HostFn, MemInfo,
    Result, StreamCallback, StreamFlags,
};

pub use event::HipEvent;
pub use stream::{HipGraph, HipStream};

/// The HIP backend: a marker type whose associated functions are HIP runtime calls. See the
/// [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hip;

impl Backend for Hip {
    const NAME: &'static str = "hip";
    type Stream = HipStream;
    type Event = HipEvent;
    /// A type without values: this backend offers no capture.
    type Graph = HipGraph;

    gpumem_core::backend_statics!(Hip);

    fn null_stream() -> HipStream {
        HipStream::NULL
    }
    /// The null stream (raw value 0): HIP 5.2 has no legacy handle, and its null stream is the
    /// blocking default stream.
    fn legacy_stream() -> HipStream {
        HipStream::LEGACY
    }
    fn per_thread_stream() -> HipStream {
        HipStream::PER_THREAD
    }
    fn stream_to_raw(stream: HipStream) -> usize {
        stream.to_usize()
    }
    /// As the trait says, with 1 (CUDA's legacy stream) read as the null stream.
    unsafe fn stream_from_raw(raw: usize) -> HipStream {
        // SAFETY: forwarded to the caller (0, 1, 2 or a live stream).
        unsafe { HipStream::from_usize(raw) }
    }

    fn device_count() -> Result<usize> {
        device::count()
    }
    fn set_device(dev: DeviceId) -> Result<()> {
        device::set_device(dev)
    }
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        device::properties(dev)
    }
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        device::mem_info(dev)
    }
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        device::synchronize(dev)
    }
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        device::can_access_peer(dev, peer)
    }
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        device::enable_peer_access(dev, peer)
    }
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        device::pointer_device(ptr)
    }

    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        memory::malloc(dev, size)
    }
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::free(dev, ptr) }
    }
    fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8> {
        memory::malloc_host(dev, size)
    }
    unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::free_host(dev, ptr) }
    }
    fn malloc_async(dev: DeviceId, size: usize, stream: HipStream) -> Result<DevicePtr> {
        memory::malloc_async(dev, size, stream)
    }
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HipStream) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::free_async(dev, ptr, stream) }
    }

    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::memcpy(dev, dst, src, n) }
    }
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: HipStream,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::memcpy_async(dev, dst, src, n, stream) }
    }
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::memset(dev, dst, value, n) }
    }
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: HipStream,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::memset_async(dev, dst, value, n, stream) }
    }

    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
        stream::priority_range(dev)
    }
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<HipStream> {
        stream::create(dev, flags, priority)
    }
    unsafe fn stream_destroy(dev: DeviceId, stream: HipStream) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { stream::destroy(dev, stream) }
    }
    /// For the null stream, the default flags without asking HIP, which refuses the question.
    fn stream_flags(dev: DeviceId, stream: HipStream) -> Result<StreamFlags> {
        stream::flags(dev, stream)
    }
    fn stream_priority(dev: DeviceId, stream: HipStream) -> Result<i32> {
        stream::priority(dev, stream)
    }
    fn stream_query(dev: DeviceId, stream: HipStream) -> Result<bool> {
        stream::query(dev, stream)
    }
    fn stream_synchronize(dev: DeviceId, stream: HipStream) -> Result<()> {
        stream::synchronize(dev, stream)
    }
    fn stream_wait_event(dev: DeviceId, stream: HipStream, event: &HipEvent) -> Result<()> {
        stream::wait_event(dev, stream, event)
    }
    /// Through `hipStreamAddCallback`: HIP 5.2's library does not export `hipLaunchHostFunc`.
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: HipStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { stream::launch_host_func(dev, stream, func, data) }
    }
    fn add_callback(dev: DeviceId, stream: HipStream, callback: StreamCallback) -> Result<()> {
        stream::add_callback(dev, stream, callback)
    }

    /// `Error::Unsupported { operation: "begin_capture", backend: "hip" }`, without calling the
    /// runtime: this backend offers no capture.
    fn begin_capture(dev: DeviceId, stream: HipStream, mode: CaptureMode) -> Result<()> {
        stream::begin_capture(dev, stream, mode)
    }
    /// `Error::Unsupported { operation: "end_capture", .. }`: this backend offers no capture.
    fn end_capture(dev: DeviceId, stream: HipStream) -> Result<HipGraph> {
        stream::end_capture(dev, stream)
    }
    /// `Error::Unsupported { operation: "capture_status", .. }`: this backend offers no capture.
    fn capture_status(dev: DeviceId, stream: HipStream) -> Result<CaptureStatus> {
        stream::capture_status(dev, stream)
    }
    /// `Error::Unsupported { operation: "graph_launch", .. }`; never reached, since no
    /// [`HipGraph`] exists.
    fn graph_launch(dev: DeviceId, graph: &HipGraph, stream: HipStream) -> Result<()> {
        stream::graph_launch(dev, graph, stream)
    }
    /// `Error::Unsupported { operation: "graph_upload", .. }`; never reached, since no
    /// [`HipGraph`] exists.
    fn graph_upload(dev: DeviceId, graph: &HipGraph, stream: HipStream) -> Result<()> {
        stream::graph_upload(dev, graph, stream)
    }
    /// `Error::Unsupported { operation: "graph_destroy", .. }`; never reached, since no
    /// [`HipGraph`] exists.
    fn graph_destroy(dev: DeviceId, graph: HipGraph) -> Result<()> {
        stream::graph_destroy(dev, graph)
    }

    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<HipEvent> {
        event::create(dev, flags)
    }
    fn event_destroy(dev: DeviceId, event: HipEvent) -> Result<()> {
        event::destroy(dev, event)
    }
    fn event_record(dev: DeviceId, event: &HipEvent, stream: HipStream) -> Result<()> {
        event::record(dev, event, stream)
    }
    fn event_query(dev: DeviceId, event: &HipEvent) -> Result<bool> {
        event::query(dev, event)
    }
    fn event_synchronize(dev: DeviceId, event: &HipEvent) -> Result<()> {
        event::synchronize(dev, event)
    }
    fn event_elapsed_ms(dev: DeviceId, start: &HipEvent, end: &HipEvent) -> Result<f32> {
        event::elapsed_ms(dev, start, end)
    }
}
