//! Streams: the default handles, creation, queries, waits, host functions and callbacks.

use std::ffi::c_void;

use crate::error::Result;
use crate::hal::types::{DeviceId, HostFn, StreamCallback, StreamFlags};
use crate::hal::Api;

/// Stream operations. See the [contract](crate::hal).
pub trait StreamOps: Api {
    /// The handle of the null stream (raw value 0).
    fn null_stream() -> Self::Stream;
    /// The handle of the legacy default stream (raw value 1 on CUDA). Synchronous copies and
    /// memsets run on it, as in CuPy.
    fn legacy_stream() -> Self::Stream;
    /// The handle of the calling thread's per-thread default stream (raw value 2).
    fn per_thread_stream() -> Self::Stream;
    /// The handle's raw value (CuPy's `Stream.ptr`).
    fn stream_to_raw(stream: Self::Stream) -> usize;
    /// A handle from its raw value.
    ///
    /// # Safety
    ///
    /// `raw` must be 0, 1, 2, or a live stream of this backend (created by it or by another
    /// library on the same runtime), and stay live while the handle is used.
    unsafe fn stream_from_raw(raw: usize) -> Self::Stream;

    /// The device's stream priority range as `(least, greatest)`; lower numbers are higher
    /// priorities on CUDA and HIP, so `least >= greatest`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)>;
    /// Creates a stream on `dev`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<Self::Stream>;
    /// Destroys a stream from [`Self::stream_create`]. Work already queued still runs.
    ///
    /// # Safety
    ///
    /// The handle came from `stream_create` and is destroyed once.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_destroy(dev: DeviceId, stream: Self::Stream) -> Result<()>;
    /// The flags the stream was created with.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_flags(dev: DeviceId, stream: Self::Stream) -> Result<StreamFlags>;
    /// The stream's priority.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_priority(dev: DeviceId, stream: Self::Stream) -> Result<i32>;
    /// `Ok(true)` when all work queued on the stream is done, `Ok(false)` while some is not.
    /// Querying a capturing stream invalidates the capture, as the runtimes do.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error for a failed query.
    unsafe fn stream_query(dev: DeviceId, stream: Self::Stream) -> Result<bool>;
    /// Waits for all work queued on the stream.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error (a capturing stream gives an error and invalidates the capture).
    unsafe fn stream_synchronize(dev: DeviceId, stream: Self::Stream) -> Result<()>;
    /// Makes future work on `stream` wait for the last `record` of `event`.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_wait_event(dev: DeviceId, stream: Self::Stream, event: &Self::Event) -> Result<()>;
    /// Queues `func(data)` on the stream, to run on a runtime thread once the work before it is
    /// done. Captured into a graph, it runs on every launch of the graph.
    ///
    /// # Safety
    ///
    /// `func` does not unwind; `data` stays valid for every call the runtime makes (once if not
    /// capturing; as long as the graph lives if capturing).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: Self::Stream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()>;
    /// Queues a one-shot callback that runs once the work before it is done, given the stream's
    /// status. Not capturable.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error (the callback is then dropped without running).
    unsafe fn add_callback(dev: DeviceId, stream: Self::Stream, callback: StreamCallback) -> Result<()>;
}
