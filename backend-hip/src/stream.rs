//! Streams, host functions, callbacks, capture and graphs.
//!
//! Capture and graphs are not offered on HIP: each capture operation answers
//! `Error::Unsupported` without calling the runtime, and [`HipGraph`] has no values. HIP 5.2
//! marks its capture and graph API as beta; its library does not export `hipGraphUpload` (so
//! `graph_upload` could not even link) nor `hipLaunchHostFunc` (so a host function could not be
//! captured into a graph, which gpumem's `Stream::launch_host_func` promises to do); and CuPy,
//! whose behaviour gpumem follows, skips its whole graph test class on HIP.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use gpumem_core::{DeviceId, HostFn, Result, StreamCallback, StreamFlags, StreamOps};
use hip_sys::hiprt::{hipStreamDefault, hipStreamNonBlocking, hipStream_t, ihipStream_t};

use crate::device::make_current;
use crate::event::HipEvent;
use crate::result::{self, check, sys, Code, ERROR_NOT_READY, SUCCESS};
use crate::Hip;

/// A HIP stream handle (`hipStream_t`): the [`Api::Stream`](gpumem_core::Api::Stream) of
/// [`Hip`](crate::Hip).
///
/// Plain data: copying it does not duplicate the stream, and dropping it destroys nothing. Besides
/// streams the runtime created, it holds HIP's two special handles: [`HipStream::NULL`] (0, the
/// device's blocking default stream, which is also [`HipStream::LEGACY`]) and
/// [`HipStream::PER_THREAD`] (2, `hipStreamPerThread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipStream(hipStream_t);

// SAFETY: a `hipStream_t` is a handle to a runtime object, never dereferenced by Rust; the HIP
// runtime is thread-safe and locks its own stream state, so the handle may be sent to and used
// from any thread.
unsafe impl Send for HipStream {}
// SAFETY: as for `Send`: `&HipStream` only gives out the handle's value.
unsafe impl Sync for HipStream {}

impl HipStream {
    /// The null stream (raw value 0): the current device's default stream, which synchronises
    /// with every blocking stream of the device.
    pub const NULL: HipStream = HipStream(ptr::null_mut());
    /// The legacy default stream: the null stream (raw value 0, where CUDA's is 1).
    ///
    /// Differs from the CUDA backend: HIP 5.2 has no `hipStreamLegacy` handle. HIP's null stream
    /// is itself the blocking default stream that synchronises with every blocking stream of its
    /// device, which is what CUDA's legacy stream is; CuPy's HIP build likewise defines
    /// `cudaStreamLegacy` as the null stream, and ROCm 6.2's `hipStreamLegacy` is an alias the
    /// runtime resolves to the null stream. Handing HIP 5.2 the value 1 would make it use address
    /// 1 as a stream object. This crate calls HIP's plain entry points, not the `_spt` ones that
    /// code compiled with per-thread default streams uses, so here the null stream is always the
    /// device's blocking default stream.
    pub const LEGACY: HipStream = HipStream::NULL;
    /// The calling thread's per-thread default stream on the current device (raw value 2):
    /// `hipStreamPerThread`, `((hipStream_t)2)` in HIP 5.2's `hip_runtime_api.h` (bindgen cannot
    /// translate the cast, so hip-sys lacks the constant).
    pub const PER_THREAD: HipStream = HipStream(ptr::without_provenance_mut::<ihipStream_t>(2));

    /// Wraps a raw handle.
    ///
    /// # Safety
    ///
    /// `stream` is null, `hipStreamPerThread` or a live stream, and stays live while the handle
    /// is used.
    #[must_use]
    pub unsafe fn from_raw(stream: hipStream_t) -> Self {
        HipStream(stream)
    }

    /// The raw handle, for calls into the runtime or other HIP libraries.
    #[must_use]
    pub fn as_raw(self) -> hipStream_t {
        self.0
    }

    /// The handle's integer value (CuPy's `Stream.ptr`); 0 for the legacy stream.
    #[must_use]
    pub fn to_usize(self) -> usize {
        self.0.addr()
    }

    /// A handle from its integer value, reading 1 (CUDA's `cudaStreamLegacy`, which HIP 5.2
    /// lacks) as the legacy stream, that is the null stream. Handles are opaque to Rust (only the
    /// runtime dereferences them), so the address carries no provenance.
    ///
    /// # Safety
    ///
    /// `raw` is 0, 1, 2 or a live stream, which stays live while the handle is used.
    #[must_use]
    pub unsafe fn from_usize(raw: usize) -> Self {
        match raw {
            gpumem_core::LEGACY_STREAM_PTR => HipStream::LEGACY,
            _ => HipStream(ptr::without_provenance_mut(raw)),
        }
    }
}

/// A host function and its argument, carried through a stream callback.
struct HostCall {
    func: HostFn,
    data: *mut c_void,
}

/// Runs a host function queued by [`launch_host_func`] on the runtime's thread. A host function
/// takes no status (and HIP 5.2 always reports success to callbacks).
///
/// Nothing unwinds out of it: the call runs inside `catch_unwind`, as in [`callback_trampoline`].
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<HostCall>)` in [`launch_host_func`] and is passed here
/// once (the runtime calls each callback once).
unsafe extern "C" fn host_call_trampoline(_stream: hipStream_t, _status: Code, data: *mut c_void) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: guaranteed by the caller: we take back the box `launch_host_func` gave out.
        let call = unsafe { Box::from_raw(data.cast::<HostCall>()) };
        // SAFETY: the `launch_host_func` contract: `func` does not unwind and `data` is valid.
        unsafe { (call.func)(call.data) };
    }));
    if let Err(payload) = outcome {
        std::mem::forget(payload);
    }
}

/// Runs a callback queued by [`add_callback`] on the runtime's thread.
///
/// Nothing unwinds out of it: the callback and its drop run inside `catch_unwind` (the typed
/// layer's callbacks already catch their panics; this is the last line), and a caught payload is
/// leaked rather than dropped, since its drop could panic too. An error status is named as any
/// other error ([`result::error`]): the runtime only looks the code up.
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<StreamCallback>)` in [`add_callback`] and is passed here
/// once (the runtime calls each callback once).
unsafe extern "C" fn callback_trampoline(_stream: hipStream_t, status: Code, data: *mut c_void) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: guaranteed by the caller (see above): we take back the box `add_callback` gave
        // out.
        let callback = unsafe { Box::from_raw(data.cast::<StreamCallback>()) };
        callback(check("hipStreamAddCallback", status));
    }));
    if let Err(payload) = outcome {
        std::mem::forget(payload);
    }
}

impl StreamOps for Hip {
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

    /// The device's stream priority range as `(least, greatest)`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
        make_current(dev)?;
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: both are valid out-pointers.
        check("hipDeviceGetStreamPriorityRange", unsafe {
            sys::hipDeviceGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        Ok((least, greatest))
    }

    /// Creates a stream on `dev`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<HipStream> {
        make_current(dev)?;
        let bits = if flags.non_blocking { hipStreamNonBlocking } else { hipStreamDefault };
        let mut stream: hipStream_t = ptr::null_mut();
        // SAFETY: `dev` is current; `stream` is a valid out-pointer; the flags are HIP's.
        check("hipStreamCreateWithPriority", unsafe {
            sys::hipStreamCreateWithPriority(&mut stream, bits, priority)
        })?;
        Ok(HipStream(stream))
    }

    /// Destroys a stream; work already queued on it still runs.
    ///
    /// # Safety
    ///
    /// The handle came from [`Self::stream_create`] and is destroyed once.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_destroy(dev: DeviceId, stream: HipStream) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees a live stream of ours, destroyed once.
        check("hipStreamDestroy", unsafe { sys::hipStreamDestroy(stream.0) })
    }

    /// The stream's creation flags.
    ///
    /// Differs from the CUDA backend for the null stream: HIP answers `hipErrorInvalidValue` when
    /// asked for its flags, where CUDA answers 0. The null stream is blocking by definition, so the
    /// default flags are returned without asking.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_flags(dev: DeviceId, stream: HipStream) -> Result<StreamFlags> {
        make_current(dev)?;
        if stream == HipStream::NULL {
            return Ok(StreamFlags::default());
        }
        let mut bits: c_uint = 0;
        // SAFETY: the handle is live (the contract); `bits` is a valid out-pointer.
        check("hipStreamGetFlags", unsafe { sys::hipStreamGetFlags(stream.0, &mut bits) })?;
        Ok(StreamFlags { non_blocking: bits & hipStreamNonBlocking != 0 })
    }

    /// The stream's priority.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_priority(dev: DeviceId, stream: HipStream) -> Result<i32> {
        make_current(dev)?;
        let mut priority: c_int = 0;
        // SAFETY: the handle is live; `priority` is a valid out-pointer.
        check("hipStreamGetPriority", unsafe { sys::hipStreamGetPriority(stream.0, &mut priority) })?;
        Ok(priority)
    }

    /// `Ok(true)` when the stream's work is done, `Ok(false)` while some is pending.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_query(dev: DeviceId, stream: HipStream) -> Result<bool> {
        make_current(dev)?;
        // SAFETY: the handle is live.
        match unsafe { sys::hipStreamQuery(stream.0) } {
            SUCCESS => Ok(true),
            ERROR_NOT_READY => Ok(false),
            code => Err(result::error("hipStreamQuery", code)),
        }
    }

    /// Waits for the stream's work.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_synchronize(dev: DeviceId, stream: HipStream) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the handle is live.
        check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream.0) })
    }

    /// Makes the stream's future work wait for the event's last record.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_wait_event(dev: DeviceId, stream: HipStream, event: &HipEvent) -> Result<()> {
        make_current(dev)?;
        // SAFETY: both handles are live; the flags must be 0.
        check("hipStreamWaitEvent", unsafe { sys::hipStreamWaitEvent(stream.0, event.as_raw(), 0) })
    }

    /// Queues `func(data)` on the stream.
    ///
    /// Differs from the CUDA backend, which calls `cuLaunchHostFunc`: HIP 5.2's headers declare
    /// `hipLaunchHostFunc`, but its library (Debian's `libamdhip64` 5.2.3) does not export it, so a
    /// program calling it does not link. The function goes through `hipStreamAddCallback` instead,
    /// which runs it on a runtime thread once the work queued before it is done and holds the
    /// stream's later work until it returns, as `hipLaunchHostFunc` does. The two would differ only
    /// under capture, which this backend does not offer: a function queued here runs exactly once.
    ///
    /// # Safety
    ///
    /// `func` does not unwind; `data` stays valid until the call.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: HipStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        make_current(dev)?;
        let call = Box::into_raw(Box::new(HostCall { func, data })).cast::<c_void>();
        // SAFETY: the handle is live; the trampoline has the runtime's callback type (with the status
        // read as an integer) and takes ownership of `call`, which the runtime passes to it once; the
        // flags must be 0.
        let code = unsafe { sys::hipStreamAddCallback(stream.0, host_call_trampoline, call, 0) };
        if code != SUCCESS {
            // SAFETY: the runtime refused the callback, so it will never call the trampoline: `call`
            // is still the box made above, and ours to drop.
            drop(unsafe { Box::from_raw(call.cast::<HostCall>()) });
            return Err(result::error("hipStreamAddCallback", code));
        }
        Ok(())
    }

    /// Queues a one-shot callback (`hipStreamAddCallback`), given the stream's status when it runs.
    ///
    /// # Errors
    ///
    /// The runtime's error; the callback is then dropped without running.
    unsafe fn add_callback(dev: DeviceId, stream: HipStream, callback: StreamCallback) -> Result<()> {
        make_current(dev)?;
        // A thin pointer for the runtime: the callback is a fat `Box<dyn FnOnce>`.
        let data = Box::into_raw(Box::new(callback)).cast::<c_void>();
        // SAFETY: the handle is live; the trampoline has the runtime's callback type (with the status
        // read as an integer) and takes ownership of `data`, which the runtime passes to it once; the
        // flags must be 0.
        let code = unsafe { sys::hipStreamAddCallback(stream.0, callback_trampoline, data, 0) };
        if code != SUCCESS {
            // SAFETY: the runtime refused the callback, so it will never call the trampoline: `data`
            // is still the box made above, and ours to drop.
            drop(unsafe { Box::from_raw(data.cast::<StreamCallback>()) });
            return Err(result::error("hipStreamAddCallback", code));
        }
        Ok(())
    }
}
