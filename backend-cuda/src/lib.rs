//! gpumem's CUDA backend: [`Cuda`] implements [`gpumem_core::Backend`] on the CUDA driver API.
//!
//! It translates each backend operation into one driver call (or a few), following the contract
//! in [`gpumem_core::backend`]: it validates nothing the typed layer already checked, keeps no
//! pool of its own, and never panics, also when the driver is missing.
//!
//! # The driver and cudarc
//!
//! The driver is reached through [cudarc]'s `sys` module (raw bindings) with this crate's own
//! thin checked-call layer over it (`result.rs`, in the manner of cudarc's `result` module).
//! cudarc's safe types (`CudaContext`, `CudaSlice`) are not used: gpumem's pool owns the memory.
//!
//! cudarc is built with `dynamic-loading`, so this crate builds on machines without CUDA and finds
//! libcuda at run time, and with the **`cuda-12000`** bindings. With dynamic loading, cudarc looks
//! each entry point up by name the first time it is called and panics if the driver lacks it. The
//! 12.0 bindings name only entry points that every driver from CUDA 12.0 on exports; a newer
//! version feature would name `_v2`/`_v3`/`_v4` entry points that older drivers lack (for
//! instance `cuStreamGetCaptureInfo_v3` from 12.3 or `cuEventElapsedTime_v2` from 13.0).
//! Drivers keep the older entry points, so a binary built with the 12.0 bindings runs on every
//! driver from 12.0 on, CUDA 13 drivers included.
//!
//! cudarc also panics when libcuda cannot be loaded. So before the first driver call this crate
//! checks, once per process, that the library loads (`is_culib_present`) and exports every entry
//! point this crate calls, then calls `cuInit(0)`. A missing library, the toolkit's stub library
//! or a driver older than CUDA 12.0 is [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound);
//! `CUDA_ERROR_NO_DEVICE` is [`Error::NoDevice`](gpumem_core::Error::NoDevice).
//!
//! # Errors
//!
//! Codes are handled as integers (cudarc types them as an enum; no integer is ever turned into
//! it). `CUDA_ERROR_OUT_OF_MEMORY` from an allocation is
//! [`Error::OutOfMemory`](gpumem_core::Error::OutOfMemory) with `total: None`;
//! `CUDA_ERROR_NO_DEVICE` is `NoDevice`; `malloc_async` on a device without memory pools is
//! [`Error::Unsupported`](gpumem_core::Error::Unsupported); every other failure is
//! [`Error::Backend`](gpumem_core::Error::Backend) with the entry point's name, the numeric code,
//! and the driver's name and text for it (`cuGetErrorName`, `cuGetErrorString`).
//!
//! # Contexts
//!
//! gpumem runs everything in each device's *primary context*, the one the CUDA runtime uses, so
//! pointers, streams and events pass freely between gpumem and runtime-API libraries. Each
//! device's primary context is retained once, on first use, and kept for the rest of the process.
//! Every operation takes the device it runs in and makes that device's primary context current
//! on the calling thread, calling `cuCtxSetCurrent` only when a thread-local cache says another
//! context is current. Code outside gpumem that changes the thread's current context behind its
//! back should make a device current again with `Device::use_device`, which always calls
//! `cuCtxSetCurrent`.
//!
//! # The associated types
//!
//! - `Stream` is [`CudaStream`], a `Copy` handle (`CUstream`). The raw values 0, 1 and 2 are the
//!   null stream, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, as in CUDA and CuPy.
//! - `Event` is [`CudaEvent`], an owned `CUevent`.
//! - `Graph` is [`CudaGraph`], the captured `CUgraph` with its instantiated `CUgraphExec`.
//!
//! # Operations worth knowing
//!
//! - Synchronous copies and memsets (`cuMemcpy`, `cuMemsetD8`) run on the legacy default stream,
//!   as CuPy's do, and then wait for it: CUDA returns from a device-to-device `cuMemcpy` and from
//!   `cuMemsetD8` before the work is done, and gpumem's synchronous forms promise it is done.
//! - The stream-ordered allocator uses each device's default memory pool, with its release
//!   threshold raised to the maximum on first use so freed memory stays cached in the driver.
//! - Host functions go to `cuLaunchHostFunc` as given (gpumem's `HostFn` is exactly the driver's
//!   function type) and are captured into graphs like any work. One-shot callbacks go through
//!   `cuStreamAddCallback` and a trampoline that never unwinds.
//! - Capture uses `cuStreamBeginCapture` with the mode asked for (relaxed by default, as CuPy),
//!   `cuStreamEndCapture` and `cuGraphInstantiateWithFlags(.., 0)`; capture status comes from
//!   `cuStreamIsCapturing`.

// CUDA runs on 64-bit hosts only, and this crate converts between gpumem's `usize` addresses and
// the driver's 64-bit `CUdeviceptr` with plain casts.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("gpumem-cuda needs a 64-bit target");

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

pub use event::CudaEvent;
pub use stream::{CudaGraph, CudaStream};

/// Whether the NVIDIA driver library (libcuda) can be loaded on this machine, asked once per
/// process. When it cannot, every operation of [`Cuda`] returns
/// [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound).
#[must_use]
pub fn driver_library_present() -> bool {
    result::library_present()
}

/// The CUDA backend: a marker type whose associated functions are driver calls. See the
/// [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cuda;

impl Backend for Cuda {
    const NAME: &'static str = "cuda";
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Graph = CudaGraph;

    gpumem_core::backend_statics!(Cuda);

    fn null_stream() -> CudaStream {
        CudaStream::NULL
    }
    fn legacy_stream() -> CudaStream {
        CudaStream::LEGACY
    }
    fn per_thread_stream() -> CudaStream {
        CudaStream::PER_THREAD
    }
    fn stream_to_raw(stream: CudaStream) -> usize {
        stream.to_usize()
    }
    unsafe fn stream_from_raw(raw: usize) -> CudaStream {
        // SAFETY: forwarded to the caller (0, 1, 2 or a live stream).
        unsafe { CudaStream::from_usize(raw) }
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
    fn malloc_async(dev: DeviceId, size: usize, stream: CudaStream) -> Result<DevicePtr> {
        memory::malloc_async(dev, size, stream)
    }
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: CudaStream) -> Result<()> {
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
        stream: CudaStream,
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
        stream: CudaStream,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { memory::memset_async(dev, dst, value, n, stream) }
    }

    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
        stream::priority_range(dev)
    }
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<CudaStream> {
        stream::create(dev, flags, priority)
    }
    unsafe fn stream_destroy(dev: DeviceId, stream: CudaStream) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { stream::destroy(dev, stream) }
    }
    fn stream_flags(dev: DeviceId, stream: CudaStream) -> Result<StreamFlags> {
        stream::flags(dev, stream)
    }
    fn stream_priority(dev: DeviceId, stream: CudaStream) -> Result<i32> {
        stream::priority(dev, stream)
    }
    fn stream_query(dev: DeviceId, stream: CudaStream) -> Result<bool> {
        stream::query(dev, stream)
    }
    fn stream_synchronize(dev: DeviceId, stream: CudaStream) -> Result<()> {
        stream::synchronize(dev, stream)
    }
    fn stream_wait_event(dev: DeviceId, stream: CudaStream, event: &CudaEvent) -> Result<()> {
        stream::wait_event(dev, stream, event)
    }
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: CudaStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { stream::launch_host_func(dev, stream, func, data) }
    }
    fn add_callback(dev: DeviceId, stream: CudaStream, callback: StreamCallback) -> Result<()> {
        stream::add_callback(dev, stream, callback)
    }

    fn begin_capture(dev: DeviceId, stream: CudaStream, mode: CaptureMode) -> Result<()> {
        stream::begin_capture(dev, stream, mode)
    }
    fn end_capture(dev: DeviceId, stream: CudaStream) -> Result<CudaGraph> {
        stream::end_capture(dev, stream)
    }
    fn capture_status(dev: DeviceId, stream: CudaStream) -> Result<CaptureStatus> {
        stream::capture_status(dev, stream)
    }
    fn graph_launch(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
        stream::graph_launch(dev, graph, stream)
    }
    fn graph_upload(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
        stream::graph_upload(dev, graph, stream)
    }
    fn graph_destroy(dev: DeviceId, graph: CudaGraph) -> Result<()> {
        stream::graph_destroy(dev, graph)
    }

    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<CudaEvent> {
        event::create(dev, flags)
    }
    fn event_destroy(dev: DeviceId, event: CudaEvent) -> Result<()> {
        event::destroy(dev, event)
    }
    fn event_record(dev: DeviceId, event: &CudaEvent, stream: CudaStream) -> Result<()> {
        event::record(dev, event, stream)
    }
    fn event_query(dev: DeviceId, event: &CudaEvent) -> Result<bool> {
        event::query(dev, event)
    }
    fn event_synchronize(dev: DeviceId, event: &CudaEvent) -> Result<()> {
        event::synchronize(dev, event)
    }
    fn event_elapsed_ms(dev: DeviceId, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        event::elapsed_ms(dev, start, end)
    }
}
