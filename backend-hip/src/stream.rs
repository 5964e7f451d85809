//! Streams: handles, creation and properties, queries and waits, host functions and callbacks;
//! and stream capture with graphs, which this backend does not offer.

use std::ffi::{c_int, c_uint, c_void};

use gpumem_core::{
    CaptureMode, CaptureStatus, DeviceId, HostFn, Result, StreamCallback, StreamFlags, PER_THREAD_STREAM_PTR,
};
use hip_sys::hiprt::{hipStreamDefault, hipStreamNonBlocking, hipStream_t};

use crate::device::set_device;
use crate::event::HipEvent;
use crate::result::{check, error, sys, unsupported, Code, ERROR_NOT_READY, SUCCESS};

/// A HIP stream handle (`hipStream_t`): the null stream, the per-thread default stream
/// (`hipStreamPerThread`, raw value 2), or a stream created by HIP. Plain data: copying it does
/// not duplicate the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipStream(hipStream_t);

// SAFETY: the handle is an opaque identifier that gpumem never dereferences; it is only passed
// to HIP runtime functions, which are thread-safe (the runtime locks its own stream state), so
// the handle may be sent to and shared between threads as CUDA's `CUstream` is.
unsafe impl Send for HipStream {}
// SAFETY: as for `Send`: shared access only copies the pointer value.
unsafe impl Sync for HipStream {}

impl HipStream {
    /// The null stream.
    pub const NULL: HipStream = HipStream(std::ptr::null_mut());

    /// The per-thread default stream: `hipStreamPerThread`, `((hipStream_t)2)` in HIP 5.2's
    /// `hip_runtime_api.h` (bindgen cannot translate the cast, so hip-sys lacks the constant).
    /// The runtime resolves it to the calling thread's default stream on the current device.
    pub const PER_THREAD: HipStream = HipStream(PER_THREAD_STREAM_PTR as hipStream_t);

    /// The raw `hipStream_t`.
    #[must_use]
    pub fn handle(self) -> hipStream_t {
        self.0
    }

    /// Wraps a raw `hipStream_t`.
    ///
    /// # Safety
    ///
    /// `handle` is null, `hipStreamPerThread`, or a live stream of the HIP runtime this process
    /// links, and stays live while the returned handle is used.
    #[must_use]
    pub unsafe fn from_handle(handle: hipStream_t) -> Self {
        HipStream(handle)
    }
}

/// The legacy default stream. HIP 5.2 has no `hipStreamLegacy` handle: HIP's null stream is
/// itself the blocking default stream that synchronises with every blocking stream of the
/// device, which is what CUDA's legacy stream is (CuPy's HIP build likewise defines
/// `cudaStreamLegacy` as the null stream, and ROCm 6.2's `hipStreamLegacy` is an alias the
/// runtime resolves to the null stream). So the legacy stream is the null handle, and its raw
/// value is 0 here, not CUDA's 1.
pub(crate) fn legacy_stream() -> HipStream {
    HipStream::NULL
}

/// A handle from a raw value: 0, 1 (the legacy stream, mapped to the null handle for the reason
/// given at [`legacy_stream`]; passing 1 to HIP 5.2 would make it use address 1 as a stream
/// object), 2, or a live stream.
///
/// # Safety
///
/// As `Backend::stream_from_raw`.
pub(crate) unsafe fn stream_from_raw(raw: usize) -> HipStream {
    match raw {
        gpumem_core::LEGACY_STREAM_PTR => legacy_stream(),
        _ => HipStream(raw as hipStream_t),
    }
}

/// The device's stream priority range as `(least, greatest)`.
pub(crate) fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
    set_device(dev)?;
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: out-pointers to locals.
    let code = unsafe { sys::hipDeviceGetStreamPriorityRange(&mut least, &mut greatest) };
    check("hipDeviceGetStreamPriorityRange", code)?;
    Ok((least, greatest))
}

/// Creates a stream on `dev`.
pub(crate) fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<HipStream> {
    set_device(dev)?;
    let bits = if flags.non_blocking { hipStreamNonBlocking } else { hipStreamDefault };
    let mut stream: hipStream_t = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the flags are HIP's.
    let code = unsafe { sys::hipStreamCreateWithPriority(&mut stream, bits, priority) };
    check("hipStreamCreateWithPriority", code)?;
    Ok(HipStream(stream))
}

/// Destroys a stream from [`stream_create`].
///
/// # Safety
///
/// As `Backend::stream_destroy`.
pub(crate) unsafe fn stream_destroy(dev: DeviceId, stream: HipStream) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees the handle came from `stream_create` and is destroyed once.
    check("hipStreamDestroy", unsafe { sys::hipStreamDestroy(stream.0) })
}

/// The flags the stream was created with.
///
/// Differs from the CUDA backend for the null stream: HIP answers `hipErrorInvalidValue` when
/// asked for the null stream's flags, where CUDA answers 0. The null stream is blocking by
/// definition, so the default flags are returned without asking.
pub(crate) fn stream_flags(dev: DeviceId, stream: HipStream) -> Result<StreamFlags> {
    if stream == HipStream::NULL {
        return Ok(StreamFlags::default());
    }
    set_device(dev)?;
    let mut bits: c_uint = 0;
    // SAFETY: an out-pointer to a local; `stream` is live (the `Backend` contract).
    check("hipStreamGetFlags", unsafe { sys::hipStreamGetFlags(stream.0, &mut bits) })?;
    Ok(StreamFlags { non_blocking: bits & hipStreamNonBlocking != 0 })
}

/// The stream's priority.
pub(crate) fn stream_priority(dev: DeviceId, stream: HipStream) -> Result<i32> {
    set_device(dev)?;
    let mut priority: c_int = 0;
    // SAFETY: an out-pointer to a local; `stream` is live.
    check("hipStreamGetPriority", unsafe { sys::hipStreamGetPriority(stream.0, &mut priority) })?;
    Ok(priority)
}

/// `Ok(true)` when the stream's work is done; `hipErrorNotReady` is `Ok(false)`.
pub(crate) fn stream_query(dev: DeviceId, stream: HipStream) -> Result<bool> {
    set_device(dev)?;
    // SAFETY: `stream` is live.
    match unsafe { sys::hipStreamQuery(stream.0) } {
        ERROR_NOT_READY => Ok(false),
        code => check("hipStreamQuery", code).map(|()| true),
    }
}

/// Waits for the stream's work.
pub(crate) fn stream_synchronize(dev: DeviceId, stream: HipStream) -> Result<()> {
    set_device(dev)?;
    // SAFETY: `stream` is live.
    check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream.0) })
}

/// Makes future work on `stream` wait for the event's last record.
pub(crate) fn stream_wait_event(dev: DeviceId, stream: HipStream, event: &HipEvent) -> Result<()> {
    set_device(dev)?;
    // SAFETY: both handles are live; the flags must be 0.
    check("hipStreamWaitEvent", unsafe { sys::hipStreamWaitEvent(stream.0, event.handle(), 0) })
}

/// A host function and its argument, carried through a stream callback.
struct HostCall {
    func: HostFn,
    data: *mut c_void,
}

/// Runs a [`HostCall`] queued by [`launch_host_func`], once, and frees it. The status is not
/// passed on: a host function takes none (HIP 5.2 always reports success here anyway).
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<HostCall>)` in [`launch_host_func`]; HIP calls a stream
/// callback exactly once.
unsafe extern "C" fn host_call_trampoline(_stream: hipStream_t, _status: Code, data: *mut c_void) {
    // SAFETY: guaranteed by the caller: the box is ours, and this is its only use.
    let call = unsafe { Box::from_raw(data.cast::<HostCall>()) };
    // SAFETY: the `launch_host_func` contract: `func` does not unwind and `data` is valid for
    // this call.
    unsafe { (call.func)(call.data) };
}

/// Queues `func(data)` on the stream.
///
/// Differs from the CUDA backend: HIP 5.2's headers declare `hipLaunchHostFunc`, but Debian's
/// `libamdhip64` 5.2.3 does not export it (a program calling it does not link), so the host
/// function is queued through `hipStreamAddCallback`, which runs it once the work before it is
/// done and holds the stream's later work until it returns, as `hipLaunchHostFunc` does. The
/// difference would show only under capture, which this backend does not offer: a function
/// queued here is never captured, so it runs exactly once.
///
/// # Safety
///
/// As `Backend::launch_host_func`.
pub(crate) unsafe fn launch_host_func(
    dev: DeviceId,
    stream: HipStream,
    func: HostFn,
    data: *mut c_void,
) -> Result<()> {
    set_device(dev)?;
    let call = Box::into_raw(Box::new(HostCall { func, data }));
    // SAFETY: `stream` is live; the trampoline takes ownership of `call` when HIP runs it, once.
    let code = unsafe { sys::hipStreamAddCallback(stream.0, host_call_trampoline, call.cast(), 0) };
    if code != SUCCESS {
        // SAFETY: HIP refused the callback, so it will never run it: the box is still ours.
        drop(unsafe { Box::from_raw(call) });
        return Err(error("hipStreamAddCallback", code));
    }
    Ok(())
}

/// Runs a [`StreamCallback`] queued by [`add_callback`] with the stream's status, once, and
/// frees it.
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<StreamCallback>)` in [`add_callback`]; HIP calls a stream
/// callback exactly once.
unsafe extern "C" fn callback_trampoline(_stream: hipStream_t, status: Code, data: *mut c_void) {
    // SAFETY: guaranteed by the caller: the box is ours, and this is its only use.
    let callback = unsafe { Box::from_raw(data.cast::<StreamCallback>()) };
    // `check` only looks the code's name up (no queue, no lock), so it is fine on the runtime's
    // callback thread. The callback does not unwind (the `Backend` contract).
    callback(check("hipStreamAddCallback", status));
}

/// Queues a one-shot callback, given the stream's status when it runs (`hipStreamAddCallback`
/// with a trampoline of this crate; the double box makes the closure a thin pointer).
pub(crate) fn add_callback(dev: DeviceId, stream: HipStream, callback: StreamCallback) -> Result<()> {
    set_device(dev)?;
    let data = Box::into_raw(Box::new(callback));
    // SAFETY: `stream` is live; the trampoline takes ownership of `data` when HIP runs it, once.
    let code = unsafe { sys::hipStreamAddCallback(stream.0, callback_trampoline, data.cast(), 0) };
    if code != SUCCESS {
        // SAFETY: HIP refused the callback, so it will never run it: the box is still ours. The
        // callback is dropped without running, as the contract says.
        drop(unsafe { Box::from_raw(data) });
        return Err(error("hipStreamAddCallback", code));
    }
    Ok(())
}

// ---- capture and graphs ------------------------------------------------------------------------
//
// Stream capture is not offered on HIP. HIP 5.2 marks its capture and graph API as beta; its
// library does not export `hipGraphUpload` (so `graph_upload` could not even link) nor
// `hipLaunchHostFunc` (so a host function could not be captured into a graph, which gpumem's
// `Stream::launch_host_func` promises); and CuPy, the behaviour gpumem follows, skips its whole
// graph test class on HIP. Each operation answers `Error::Unsupported` without calling the
// runtime.

/// An instantiated HIP graph: a type with no values. This backend offers no capture, so
/// [`end_capture`] never returns a graph, and the graph operations can never be reached with one;
/// the compiler knows it.
#[derive(Debug)]
pub enum HipGraph {}

/// `Unsupported`: this backend offers no stream capture (see above).
pub(crate) fn begin_capture(_dev: DeviceId, _stream: HipStream, _mode: CaptureMode) -> Result<()> {
    Err(unsupported("begin_capture"))
}

/// `Unsupported`: this backend offers no stream capture.
pub(crate) fn end_capture(_dev: DeviceId, _stream: HipStream) -> Result<HipGraph> {
    Err(unsupported("end_capture"))
}

/// `Unsupported`: this backend offers no stream capture. (The typed layer reads this as "not
/// capturing" where it must know, as CuPy skips its capture checks on HIP.)
pub(crate) fn capture_status(_dev: DeviceId, _stream: HipStream) -> Result<CaptureStatus> {
    Err(unsupported("capture_status"))
}

/// `Unsupported`; unreachable, as no [`HipGraph`] exists.
pub(crate) fn graph_launch(_dev: DeviceId, _graph: &HipGraph, _stream: HipStream) -> Result<()> {
    Err(unsupported("graph_launch"))
}

/// `Unsupported`; unreachable, as no [`HipGraph`] exists.
pub(crate) fn graph_upload(_dev: DeviceId, _graph: &HipGraph, _stream: HipStream) -> Result<()> {
    Err(unsupported("graph_upload"))
}

/// `Unsupported`; unreachable, as no [`HipGraph`] exists.
pub(crate) fn graph_destroy(_dev: DeviceId, _graph: HipGraph) -> Result<()> {
    Err(unsupported("graph_destroy"))
}
