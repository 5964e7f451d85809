//! gpumem's backend chosen at run time: [`Auto`] runs on CUDA where its driver finds a device,
//! else on HIP where its runtime finds one, else on the host backend, so one program built with
//! `--features cuda,hip` runs on an NVIDIA machine, an AMD one, and a machine with neither.
//!
//! # The choice
//!
//! The first operation of `Auto` (or a call of [`chosen`]) chooses, once per process:
//!
//! - `GPUMEM_BACKEND=cuda`, `hip` or `host` picks that backend, whatever the machine has. A
//!   backend so named that the program was built without, or any other value, is
//!   `Error::InvalidEnvironment` naming the variable, its value and the accepted forms, and every
//!   operation then returns that error.
//! - Unset (or empty): CUDA if its feature is on and `cuDeviceGetCount` finds a device (the
//!   driver loads at run time, so a machine without it answers no); else HIP likewise (its
//!   runtime also loads at run time); else the host backend.
//!
//! The choice is then fixed: a `OnceLock` read and one `match` per backend call, a branch that
//! always goes the same way. The typed layer's hot paths (a pool cache hit) call no backend, so
//! they cost what they cost on the chosen backend itself; `Auto` has its own typed-layer state
//! (pools, current streams), apart from that of the backend it chose.
//!
//! # Handles
//!
//! [`AutoStream`], [`AutoEvent`] and [`AutoGraph`] are enums with one variant per backend built
//! in, each holding that backend's own handle. Every operation dispatches on the choice and
//! unwraps the handle of the chosen backend; a handle of another backend (only the `unsafe` raw
//! constructors could make one) is `Error::InvalidArgument`. The raw value of a stream
//! ([`StreamOps::stream_to_raw`]) is the chosen backend's own, so a stream passes to and from
//! CUDA, HIP or host code unchanged.
//!
//! # Capabilities
//!
//! `CAPS` is a constant, so it cannot follow the choice: it is what every backend built in can
//! do (the intersection). With `hip` built in, that means no capture, even when CUDA is chosen:
//! the typed layer then answers capture calls `Unsupported`, and `Auto`'s own graph operations
//! do too, without calling the backend. A program that needs capture on NVIDIA GPUs and no HIP
//! builds with `cuda` alone (host and CUDA both capture) or uses `gpumem::cuda` directly.
//!
//! # Errors
//!
//! The chosen backend's errors, unchanged (their `backend` is `"cuda"`, `"hip"` or `"host"`);
//! `InvalidEnvironment` from the choice; `InvalidArgument` for a foreign handle.

mod choice;
mod handles;

use std::ffi::c_void;

use gpumem_core::host::Host;
use gpumem_core::{
    Api, Caps, CaptureMode, CaptureStatus, DeviceId, DeviceOps, DeviceProperties, DevicePtr, Error,
    EventFlags, EventOps, GraphOps, HostFn, MemInfo, MemoryOps, PhysicalHandle, Result, StreamCallback,
    StreamFlags, StreamOps, VirtualMemoryOps,
};

pub use choice::{chosen, Choice, BACKEND_ENV};
use handles::Member;
pub use handles::{AutoEvent, AutoGraph, AutoStream};

/// The backend chosen at run time. See the [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Auto;

/// What both backends can do.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
const fn meet(a: Caps, b: Caps) -> Caps {
    Caps {
        capture: a.capture && b.capture,
        stream_ordered_allocation: a.stream_ordered_allocation && b.stream_ordered_allocation,
        host_functions: a.host_functions && b.host_functions,
        virtual_memory: a.virtual_memory && b.virtual_memory,
        peer_access: a.peer_access && b.peer_access,
    }
}

impl Api for Auto {
    const NAME: &'static str = "auto";
    /// What every backend built in can do (see the [crate docs](crate#capabilities)).
    const CAPS: Caps = {
        let caps = Host::CAPS;
        #[cfg(feature = "cuda")]
        let caps = meet(caps, gpumem_cuda::Cuda::CAPS);
        #[cfg(feature = "hip")]
        let caps = meet(caps, gpumem_hip::Hip::CAPS);
        caps
    };
    type Stream = AutoStream;
    type Event = AutoEvent;
    type Graph = AutoGraph;
}

gpumem_core::runtime_statics!(Auto);

/// Runs `$body` with `$B` the chosen backend's type; returns the choice's error first.
macro_rules! on_chosen {
    ($B:ident => $body:expr) => {
        match chosen()? {
            Choice::Host => {
                type $B = Host;
                $body
            }
            #[cfg(feature = "cuda")]
            Choice::Cuda => {
                type $B = gpumem_cuda::Cuda;
                $body
            }
            #[cfg(feature = "hip")]
            Choice::Hip => {
                type $B = gpumem_hip::Hip;
                $body
            }
        }
    };
}

/// As [`on_chosen`], for the infallible operations: `$fallback` where no backend could be
/// chosen (every fallible operation then returns the choice's error before touching a handle).
macro_rules! on_chosen_or {
    ($B:ident => $body:expr, $fallback:expr) => {
        match chosen() {
            Ok(Choice::Host) => {
                type $B = Host;
                $body
            }
            #[cfg(feature = "cuda")]
            Ok(Choice::Cuda) => {
                type $B = gpumem_cuda::Cuda;
                $body
            }
            #[cfg(feature = "hip")]
            Ok(Choice::Hip) => {
                type $B = gpumem_hip::Hip;
                $body
            }
            Err(_) => $fallback,
        }
    };
}

/// `Unsupported` for virtual memory, where `CAPS` says not every backend built in has it.
fn vm_unsupported() -> Error {
    Error::Unsupported { operation: "virtual memory", backend: "auto" }
}

/// Virtual memory on the chosen backend, where every backend built in has it (`CAPS`, as for
/// capture): addresses and physical handles are plain integers and pass through unchanged.
/// Otherwise every operation answers `Unsupported`, whichever backend was chosen.
impl VirtualMemoryOps for Auto {
    fn vm_granularity(dev: DeviceId) -> Result<usize> {
        if !Self::CAPS.virtual_memory {
            return Err(vm_unsupported());
        }
        on_chosen!(B => B::vm_granularity(dev))
    }
    fn vm_reserve(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        if !Self::CAPS.virtual_memory {
            return Err(vm_unsupported());
        }
        on_chosen!(B => B::vm_reserve(dev, size))
    }
    unsafe fn vm_free_range(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        // SAFETY: forwarded to the caller; the range came from the same chosen backend.
        on_chosen!(B => unsafe { B::vm_free_range(dev, ptr, size) })
    }
    fn vm_create(dev: DeviceId, size: usize) -> Result<PhysicalHandle> {
        if !Self::CAPS.virtual_memory {
            return Err(vm_unsupported());
        }
        on_chosen!(B => B::vm_create(dev, size))
    }
    unsafe fn vm_release(dev: DeviceId, handle: PhysicalHandle) -> Result<()> {
        // SAFETY: forwarded to the caller.
        on_chosen!(B => unsafe { B::vm_release(dev, handle) })
    }
    unsafe fn vm_map(dev: DeviceId, ptr: DevicePtr, size: usize, handle: PhysicalHandle) -> Result<()> {
        // SAFETY: forwarded to the caller.
        on_chosen!(B => unsafe { B::vm_map(dev, ptr, size, handle) })
    }
    unsafe fn vm_set_access(dev: DeviceId, ptr: DevicePtr, size: usize, devices: &[DeviceId]) -> Result<()> {
        // SAFETY: forwarded to the caller.
        on_chosen!(B => unsafe { B::vm_set_access(dev, ptr, size, devices) })
    }
    unsafe fn vm_unmap(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        on_chosen!(B => unsafe { B::vm_unmap(dev, ptr, size) })
    }
}

impl DeviceOps for Auto {
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn device_count() -> Result<usize> {
        on_chosen!(B => B::device_count())
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn set_device(dev: DeviceId) -> Result<()> {
        on_chosen!(B => B::set_device(dev))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        on_chosen!(B => B::device_properties(dev))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        on_chosen!(B => B::mem_get_info(dev))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        on_chosen!(B => B::device_synchronize(dev))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        on_chosen!(B => B::can_access_peer(dev, peer))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        on_chosen!(B => B::enable_peer_access(dev, peer))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        on_chosen!(B => B::pointer_device(ptr))
    }
}

impl MemoryOps for Auto {
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        on_chosen!(B => B::malloc(dev, size))
    }
    /// # Safety
    ///
    /// As [`MemoryOps::free`] of the chosen backend.
    ///
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        // SAFETY: forwarded: `ptr` came from `malloc`, which the same chosen backend served.
        on_chosen!(B => unsafe { B::free(dev, ptr) })
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8> {
        on_chosen!(B => B::malloc_host(dev, size))
    }
    /// # Safety
    ///
    /// As [`MemoryOps::free_host`] of the chosen backend.
    ///
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()> {
        // SAFETY: forwarded: `ptr` came from `malloc_host` of the same chosen backend.
        on_chosen!(B => unsafe { B::free_host(dev, ptr) })
    }
    /// # Safety
    ///
    /// As [`MemoryOps::malloc_async`]: the stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn malloc_async(dev: DeviceId, size: usize, stream: AutoStream) -> Result<DevicePtr> {
        // SAFETY: forwarded: the handle is live and the chosen backend's own.
        on_chosen!(B => unsafe { B::malloc_async(dev, size, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// As [`MemoryOps::free_async`].
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: AutoStream) -> Result<()> {
        // SAFETY: forwarded: `ptr` came from `malloc_async` of the chosen backend; the handle is
        // live and its own.
        on_chosen!(B => unsafe { B::free_async(dev, ptr, B::stream(stream)?) })
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn async_pool_attribute(dev: DeviceId, attribute: gpumem_core::AsyncPoolAttribute) -> Result<u64> {
        on_chosen!(B => B::async_pool_attribute(dev, attribute))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn async_pool_set_release_threshold(dev: DeviceId, bytes: u64) -> Result<()> {
        on_chosen!(B => B::async_pool_set_release_threshold(dev, bytes))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn async_pool_trim_to(dev: DeviceId, keep: usize) -> Result<()> {
        on_chosen!(B => B::async_pool_trim_to(dev, keep))
    }
    /// # Safety
    ///
    /// As [`MemoryOps::memcpy`].
    ///
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        // SAFETY: forwarded: the caller guarantees both ranges.
        on_chosen!(B => unsafe { B::memcpy(dev, dst, src, n) })
    }
    /// # Safety
    ///
    /// As [`MemoryOps::memcpy_async`].
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: AutoStream,
    ) -> Result<()> {
        // SAFETY: forwarded: the caller guarantees both ranges until the stream reaches the copy;
        // the handle is live and the chosen backend's own.
        on_chosen!(B => unsafe { B::memcpy_async(dev, dst, src, n, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// As [`MemoryOps::memset`].
    ///
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        // SAFETY: forwarded: the caller guarantees the range.
        on_chosen!(B => unsafe { B::memset(dev, dst, value, n) })
    }
    /// # Safety
    ///
    /// As [`MemoryOps::memset_async`].
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: AutoStream,
    ) -> Result<()> {
        // SAFETY: forwarded: the caller guarantees the range until the stream reaches the memset;
        // the handle is live and the chosen backend's own.
        on_chosen!(B => unsafe { B::memset_async(dev, dst, value, n, B::stream(stream)?) })
    }
    /// The chosen backend's answer; `false` where none could be chosen (every copy then fails
    /// with the choice's error before this matters).
    fn stages_pageable_copies() -> bool {
        on_chosen_or!(B => B::stages_pageable_copies(), false)
    }
}

impl StreamOps for Auto {
    fn null_stream() -> AutoStream {
        on_chosen_or!(B => B::wrap_stream(B::null_stream()), AutoStream::Host(Host::null_stream()))
    }
    fn legacy_stream() -> AutoStream {
        on_chosen_or!(B => B::wrap_stream(B::legacy_stream()), AutoStream::Host(Host::legacy_stream()))
    }
    fn per_thread_stream() -> AutoStream {
        on_chosen_or!(B => B::wrap_stream(B::per_thread_stream()), AutoStream::Host(Host::per_thread_stream()))
    }
    /// The chosen backend's raw value of the stream.
    fn stream_to_raw(stream: AutoStream) -> usize {
        match stream {
            AutoStream::Host(s) => Host::stream_to_raw(s),
            #[cfg(feature = "cuda")]
            AutoStream::Cuda(s) => gpumem_cuda::Cuda::stream_to_raw(s),
            #[cfg(feature = "hip")]
            AutoStream::Hip(s) => gpumem_hip::Hip::stream_to_raw(s),
        }
    }
    /// A stream of the chosen backend from its raw value (the host's reading where no backend
    /// could be chosen: every operation then fails with the choice's error).
    unsafe fn stream_from_raw(raw: usize) -> AutoStream {
        on_chosen_or!(
            // SAFETY: forwarded: `raw` is 0, 1, 2 or a live stream of the chosen backend.
            B => B::wrap_stream(unsafe { B::stream_from_raw(raw) }),
            // SAFETY: the host only stores the value; no operation reaches the host with it, since
            // each first returns the choice's error.
            AutoStream::Host(unsafe { Host::stream_from_raw(raw) })
        )
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
        on_chosen!(B => B::stream_priority_range(dev))
    }
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<AutoStream> {
        on_chosen!(B => B::stream_create(dev, flags, priority).map(B::wrap_stream))
    }
    /// # Safety
    ///
    /// As [`StreamOps::stream_destroy`].
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn stream_destroy(dev: DeviceId, stream: AutoStream) -> Result<()> {
        // SAFETY: forwarded: the stream came from `stream_create` and is destroyed once.
        on_chosen!(B => unsafe { B::stream_destroy(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn stream_flags(dev: DeviceId, stream: AutoStream) -> Result<StreamFlags> {
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::stream_flags(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn stream_priority(dev: DeviceId, stream: AutoStream) -> Result<i32> {
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::stream_priority(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn stream_query(dev: DeviceId, stream: AutoStream) -> Result<bool> {
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::stream_query(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn stream_synchronize(dev: DeviceId, stream: AutoStream) -> Result<()> {
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::stream_synchronize(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream or event; the chosen
    /// backend's.
    unsafe fn stream_wait_event(dev: DeviceId, stream: AutoStream, event: &AutoEvent) -> Result<()> {
        // SAFETY: forwarded: both handles are live.
        on_chosen!(B => unsafe { B::stream_wait_event(dev, B::stream(stream)?, B::event(event)?) })
    }
    /// # Safety
    ///
    /// As [`StreamOps::launch_host_func`]: `func` does not unwind; `data` stays valid until the
    /// call (or, captured, for as long as the graph can run).
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: AutoStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        // SAFETY: forwarded: the caller's guarantees about `func` and `data`; the handle is live.
        on_chosen!(B => unsafe { B::launch_host_func(dev, B::stream(stream)?, func, data) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream (the callback is then
    /// dropped without running); the chosen backend's.
    unsafe fn add_callback(dev: DeviceId, stream: AutoStream, callback: StreamCallback) -> Result<()> {
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::add_callback(dev, B::stream(stream)?, callback) })
    }
}

impl EventOps for Auto {
    /// # Errors
    ///
    /// The choice's error; the chosen backend's.
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<AutoEvent> {
        on_chosen!(B => B::event_create(dev, flags).map(B::wrap_event))
    }
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign event; the chosen backend's.
    fn event_destroy(dev: DeviceId, event: AutoEvent) -> Result<()> {
        on_chosen!(B => B::event_destroy(dev, B::take_event(event)?))
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign stream or event; the chosen
    /// backend's.
    unsafe fn event_record(dev: DeviceId, event: &AutoEvent, stream: AutoStream) -> Result<()> {
        // SAFETY: forwarded: the stream handle is live.
        on_chosen!(B => unsafe { B::event_record(dev, B::event(event)?, B::stream(stream)?) })
    }
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign event; the chosen backend's.
    fn event_query(dev: DeviceId, event: &AutoEvent) -> Result<bool> {
        on_chosen!(B => B::event_query(dev, B::event(event)?))
    }
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign event; the chosen backend's.
    fn event_synchronize(dev: DeviceId, event: &AutoEvent) -> Result<()> {
        on_chosen!(B => B::event_synchronize(dev, B::event(event)?))
    }
    /// # Errors
    ///
    /// The choice's error; `InvalidArgument` for a foreign event; the chosen backend's.
    fn event_elapsed_ms(dev: DeviceId, start: &AutoEvent, end: &AutoEvent) -> Result<f32> {
        on_chosen!(B => B::event_elapsed_ms(dev, B::event(start)?, B::event(end)?))
    }
}

/// `Unsupported` for a capture operation when this build's capabilities have no capture.
fn no_capture(operation: &'static str) -> Error {
    Error::Unsupported { operation, backend: Auto::NAME }
}

impl GraphOps for Auto {
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// `Unsupported` when `CAPS` has no capture (without calling a backend); the choice's
    /// error; `InvalidArgument` for a foreign stream; the chosen backend's.
    unsafe fn begin_capture(dev: DeviceId, stream: AutoStream, mode: CaptureMode) -> Result<()> {
        if !Self::CAPS.capture {
            return Err(no_capture("begin_capture"));
        }
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::begin_capture(dev, B::stream(stream)?, mode) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// As [`Self::begin_capture`].
    unsafe fn end_capture(dev: DeviceId, stream: AutoStream) -> Result<AutoGraph> {
        if !Self::CAPS.capture {
            return Err(no_capture("end_capture"));
        }
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::end_capture(dev, B::stream(stream)?) }.map(B::wrap_graph))
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// As [`Self::begin_capture`].
    unsafe fn capture_status(dev: DeviceId, stream: AutoStream) -> Result<CaptureStatus> {
        if !Self::CAPS.capture {
            return Err(no_capture("capture_status"));
        }
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::capture_status(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// As [`Self::capture_status`].
    unsafe fn capture_id(dev: DeviceId, stream: AutoStream) -> Result<Option<u64>> {
        if !Self::CAPS.capture {
            return Err(no_capture("capture_id"));
        }
        // SAFETY: forwarded: the handle is live.
        on_chosen!(B => unsafe { B::capture_id(dev, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// As [`Self::begin_capture`], also for a foreign graph.
    unsafe fn graph_launch(dev: DeviceId, graph: &AutoGraph, stream: AutoStream) -> Result<()> {
        if !Self::CAPS.capture {
            return Err(no_capture("graph_launch"));
        }
        // SAFETY: forwarded: the handles are live.
        on_chosen!(B => unsafe { B::graph_launch(dev, B::graph(graph)?, B::stream(stream)?) })
    }
    /// # Safety
    ///
    /// The stream is live.
    ///
    /// # Errors
    ///
    /// As [`Self::graph_launch`].
    unsafe fn graph_upload(dev: DeviceId, graph: &AutoGraph, stream: AutoStream) -> Result<()> {
        if !Self::CAPS.capture {
            return Err(no_capture("graph_upload"));
        }
        // SAFETY: forwarded: the handles are live.
        on_chosen!(B => unsafe { B::graph_upload(dev, B::graph(graph)?, B::stream(stream)?) })
    }
    /// # Errors
    ///
    /// As [`Self::graph_launch`].
    fn graph_debug_dot(dev: DeviceId, graph: &AutoGraph, flags: u32) -> Result<String> {
        if !Self::CAPS.capture {
            return Err(no_capture("graph_debug_dot"));
        }
        on_chosen!(B => B::graph_debug_dot(dev, B::graph(graph)?, flags))
    }
    /// # Errors
    ///
    /// As [`Self::graph_launch`].
    fn graph_destroy(dev: DeviceId, graph: AutoGraph) -> Result<()> {
        if !Self::CAPS.capture {
            return Err(no_capture("graph_destroy"));
        }
        on_chosen!(B => B::graph_destroy(dev, B::take_graph(graph)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_what_every_backend_built_in_can_do() {
        let all = [
            Host::CAPS,
            #[cfg(feature = "cuda")]
            gpumem_cuda::Cuda::CAPS,
            #[cfg(feature = "hip")]
            gpumem_hip::Hip::CAPS,
        ];
        let c = Auto::CAPS;
        assert_eq!(c.capture, all.iter().all(|b| b.capture));
        assert_eq!(c.stream_ordered_allocation, all.iter().all(|b| b.stream_ordered_allocation));
        assert_eq!(c.host_functions, all.iter().all(|b| b.host_functions));
        assert_eq!(c.virtual_memory, all.iter().all(|b| b.virtual_memory));
        assert_eq!(c.peer_access, all.iter().all(|b| b.peer_access));
        // HIP has no capture in gpumem, so a build with it has none.
        assert_eq!(c.capture, !cfg!(feature = "hip"));
    }
}
