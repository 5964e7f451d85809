//! gpumem's HIP backend: [`Hip`], the [`Backend`] of AMD GPUs through the HIP runtime
//! (`libamdhip64`), on hip-sys's bindings.
//!
//! It translates each of gpumem's raw operations into HIP runtime calls, as the contract in
//! [`gpumem_core::backend`] says: it validates no user input, pools nothing, keeps no
//! user-visible state and never panics. The files mirror the CUDA backend's, item for item:
//! `result` (checked calls, error mapping, the once-only runtime check), `device`, `memory`,
//! `stream` (with capture and graphs), `event`. Every place where HIP makes this backend
//! differ from the CUDA one says so where it happens.
//!
//! # Building and linking
//!
//! hip-sys (through hip-runtime-sys) ships bindings generated from HIP 5.4's headers, and its
//! build script links `amdhip64` at link time: it looks for `include/hip/hip_runtime_api.h`
//! under `hipconfig -p`, `$HIP_PATH`, `$ROCM_PATH`, `/opt/rocm` and `/opt/rocm/hip` (the build
//! fails when none has it) and adds `$HIP_PATH/lib` to the library search path. On Debian 12 the
//! runtime and headers come from `libamdhip64-dev` (HIP 5.2.3), installed under `/usr`:
//!
//! ```text
//! apt-get install -y libamdhip64-dev
//! HIP_PATH=/usr cargo build -p gpumem-hip
//! ```
//!
//! # A missing runtime library
//!
//! Because the library is linked, not loaded, a program built with this backend needs
//! `libamdhip64.so.5` to start at all: without it the dynamic loader stops the program before
//! `main` ("error while loading shared libraries"). So this backend never returns
//! `Error::DriverNotFound`; the CUDA backend, which loads its driver at run time, does. Loading
//! `libamdhip64` at run time instead would mean declaring and resolving every function through
//! `dlopen`, with hip-sys kept only for its types while its build script still requires the
//! headers; gpumem does not do that. What the library itself reports is mapped in full: on a
//! machine with the library but no AMD GPU (no `/dev/kfd`), `hipGetDeviceCount` answers
//! `hipErrorNoDevice`, and every operation of this backend then returns
//! [`Error::NoDevice`](gpumem_core::Error::NoDevice).
//!
//! # Errors
//!
//! - `hipErrorNoDevice` (100), or a device count of 0: `Error::NoDevice { backend: "hip" }`.
//! - `hipErrorOutOfMemory` (2) from an allocation (`hipMalloc`, `hipHostMalloc`,
//!   `hipMallocAsync`): `Error::OutOfMemory { size, total: None }`, so the pool's retry ladder runs.
//! - Everything else: `Error::Backend` with the API's name, the numeric code, and the runtime's
//!   `hipGetErrorName` / `hipGetErrorString` for it.
//!
//! Codes are read as integers. hip-sys declares `hipError_t` as a Rust enum, and receiving a
//! value it does not list would be undefined behaviour, so this crate declares the functions it
//! calls itself with a `u32` status (the `result` module says more).
//!
//! # What HIP lacks, and what this backend does instead
//!
//! | CUDA backend | HIP backend |
//! | --- | --- |
//! | legacy default stream, raw value 1 | HIP 5.2 has no `hipStreamLegacy`; HIP's null stream is the blocking default stream, so [`Backend::legacy_stream`] is the null handle (raw value 0), and a raw value of 1 is read as the null stream |
//! | per-thread default stream, raw value 2 | `hipStreamPerThread`, also 2 |
//! | `cuLaunchHostFunc` | HIP 5.2's library does not export `hipLaunchHostFunc`: host functions go through `hipStreamAddCallback` |
//! | stream capture and graphs | not offered: every capture operation returns `Error::Unsupported`, and [`HipGraph`] has no values |
//! | stream-ordered allocator | `hipMallocAsync` where the device reports memory pools; `Unsupported` otherwise |
//! | flags of the null stream | answered without asking HIP, which refuses the question |
//! | pointer attributes of plain host memory | HIP 5 answers `hipErrorInvalidValue`, read as "not device memory" |
//! | device properties | read attribute by attribute: hip-sys's `hipDeviceProp_t` layout is HIP 5.4's and changed in ROCm 6 |
//!
//! # Devices and threads
//!
//! Every operation makes its device current first, with `hipSetDevice`, cached per thread: a
//! thread that keeps working on one device makes that call once. A program that also calls
//! `hipSetDevice` itself, on a thread gpumem uses, leaves the cache stale; gpumem's own device
//! switches ([`gpumem_core::Device`]) go through this backend and keep it right.
//!
//! # Tests
//!
//! `tests/hip.rs` runs everywhere the library is installed: on a machine without an AMD GPU it
//! checks the no-device answers and the unsupported capture operations. The tests that need a
//! GPU are ignored with the reason; run them with `--include-ignored` on a machine with one,
//! where they fail, rather than skip, when no device is found.

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

/// The HIP backend: gpumem on AMD GPUs. See the [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hip;

impl Backend for Hip {
    const NAME: &'static str = "hip";
    type Stream = HipStream;
    type Event = HipEvent;
    /// No values: this backend offers no stream capture.
    type Graph = HipGraph;

    gpumem_core::backend_statics!(Hip);

    fn null_stream() -> HipStream {
        HipStream::NULL
    }
    /// The null handle (raw value 0): HIP's null stream is its blocking default stream, and HIP
    /// 5.2 has no separate legacy handle.
    fn legacy_stream() -> HipStream {
        stream::legacy_stream()
    }
    fn per_thread_stream() -> HipStream {
        HipStream::PER_THREAD
    }
    fn stream_to_raw(stream: HipStream) -> usize {
        stream.handle() as usize
    }
    /// As the trait says, with 1 (CUDA's legacy stream) read as the null stream.
    unsafe fn stream_from_raw(raw: usize) -> HipStream {
        // SAFETY: forwarded to the caller.
        unsafe { stream::stream_from_raw(raw) }
    }

    fn device_count() -> Result<usize> {
        device::device_count()
    }
    fn set_device(dev: DeviceId) -> Result<()> {
        device::set_device(dev)
    }
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        device::device_properties(dev)
    }
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        device::mem_get_info(dev)
    }
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        device::device_synchronize(dev)
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
    /// `hipMallocAsync`, or `Unsupported` where the device reports no memory pools.
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
        stream::stream_priority_range(dev)
    }
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<HipStream> {
        stream::stream_create(dev, flags, priority)
    }
    unsafe fn stream_destroy(dev: DeviceId, stream: HipStream) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { stream::stream_destroy(dev, stream) }
    }
    /// The default flags for the null stream without asking HIP (which refuses the question).
    fn stream_flags(dev: DeviceId, stream: HipStream) -> Result<StreamFlags> {
        stream::stream_flags(dev, stream)
    }
    fn stream_priority(dev: DeviceId, stream: HipStream) -> Result<i32> {
        stream::stream_priority(dev, stream)
    }
    fn stream_query(dev: DeviceId, stream: HipStream) -> Result<bool> {
        stream::stream_query(dev, stream)
    }
    fn stream_synchronize(dev: DeviceId, stream: HipStream) -> Result<()> {
        stream::stream_synchronize(dev, stream)
    }
    fn stream_wait_event(dev: DeviceId, stream: HipStream, event: &HipEvent) -> Result<()> {
        stream::stream_wait_event(dev, stream, event)
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

    /// Always `Error::Unsupported { operation: "begin_capture", backend: "hip" }`, without
    /// calling HIP: this backend offers no stream capture (see `HipGraph`).
    fn begin_capture(dev: DeviceId, stream: HipStream, mode: CaptureMode) -> Result<()> {
        stream::begin_capture(dev, stream, mode)
    }
    /// Always `Error::Unsupported { operation: "end_capture", backend: "hip" }`.
    fn end_capture(dev: DeviceId, stream: HipStream) -> Result<HipGraph> {
        stream::end_capture(dev, stream)
    }
    /// Always `Error::Unsupported { operation: "capture_status", backend: "hip" }`.
    fn capture_status(dev: DeviceId, stream: HipStream) -> Result<CaptureStatus> {
        stream::capture_status(dev, stream)
    }
    /// `Error::Unsupported { operation: "graph_launch", .. }`; unreachable, as no `HipGraph`
    /// exists.
    fn graph_launch(dev: DeviceId, graph: &HipGraph, stream: HipStream) -> Result<()> {
        stream::graph_launch(dev, graph, stream)
    }
    /// `Error::Unsupported { operation: "graph_upload", .. }`; unreachable, as no `HipGraph`
    /// exists.
    fn graph_upload(dev: DeviceId, graph: &HipGraph, stream: HipStream) -> Result<()> {
        stream::graph_upload(dev, graph, stream)
    }
    /// `Error::Unsupported { operation: "graph_destroy", .. }`; unreachable, as no `HipGraph`
    /// exists.
    fn graph_destroy(dev: DeviceId, graph: HipGraph) -> Result<()> {
        stream::graph_destroy(dev, graph)
    }

    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<HipEvent> {
        event::event_create(dev, flags)
    }
    fn event_destroy(dev: DeviceId, event: HipEvent) -> Result<()> {
        event::event_destroy(dev, event)
    }
    fn event_record(dev: DeviceId, event: &HipEvent, stream: HipStream) -> Result<()> {
        event::event_record(dev, event, stream)
    }
    fn event_query(dev: DeviceId, event: &HipEvent) -> Result<bool> {
        event::event_query(dev, event)
    }
    fn event_synchronize(dev: DeviceId, event: &HipEvent) -> Result<()> {
        event::event_synchronize(dev, event)
    }
    fn event_elapsed_ms(dev: DeviceId, start: &HipEvent, end: &HipEvent) -> Result<f32> {
        event::event_elapsed_ms(dev, start, end)
    }
}
