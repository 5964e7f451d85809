//! Streams, host functions, callbacks, capture and graphs.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use cudarc::driver::sys::{
    self, CUgraph, CUgraphExec, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUstream_st,
};
use gpumem_core::{CaptureMode, CaptureStatus, DeviceId, Error, HostFn, Result, StreamCallback, StreamFlags};

use crate::device::make_current;
use crate::event::CudaEvent;
use crate::result::{self, check, code, BACKEND, ERROR_NOT_READY, SUCCESS};

/// A CUDA stream handle (`CUstream`): the [`Backend::Stream`](gpumem_core::Backend::Stream) of
/// [`Cuda`](crate::Cuda).
///
/// Plain data: copying it does not duplicate the stream, and dropping it destroys nothing. Besides
/// streams the driver created, it holds the driver's three special handles: [`CudaStream::NULL`]
/// (0, the context's default stream, which is the legacy stream), [`CudaStream::LEGACY`] (1,
/// `CU_STREAM_LEGACY`) and [`CudaStream::PER_THREAD`] (2, `CU_STREAM_PER_THREAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream(CUstream);

// SAFETY: a `CUstream` is a handle to a driver object, never dereferenced by Rust; the CUDA
// driver API is thread-safe, and the driver serialises every use of a stream internally, so the
// handle may be sent to and used from any thread.
unsafe impl Send for CudaStream {}
// SAFETY: as for `Send`: `&CudaStream` only gives out the handle's value.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// The null stream (raw value 0): the current context's default stream. The driver API is
    /// used without per-thread default streams, so this is the legacy stream.
    pub const NULL: CudaStream = CudaStream(ptr::null_mut());
    /// The legacy default stream (`CU_STREAM_LEGACY`, raw value 1), which synchronises with every
    /// blocking stream of its context.
    pub const LEGACY: CudaStream = CudaStream(ptr::without_provenance_mut::<CUstream_st>(1));
    /// The calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`, raw value 2).
    pub const PER_THREAD: CudaStream = CudaStream(ptr::without_provenance_mut::<CUstream_st>(2));

    /// Wraps a raw handle.
    ///
    /// # Safety
    ///
    /// `stream` is null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a live stream, and stays
    /// live while the handle is used.
    #[must_use]
    pub unsafe fn from_raw(stream: CUstream) -> Self {
        CudaStream(stream)
    }

    /// The raw handle, for calls into the driver or other CUDA libraries.
    #[must_use]
    pub fn as_raw(self) -> CUstream {
        self.0
    }

    /// The handle's integer value (CuPy's `Stream.ptr`).
    #[must_use]
    pub fn to_usize(self) -> usize {
        self.0.addr()
    }

    /// A handle from its integer value. Handles are opaque to Rust (only the driver dereferences
    /// them), so the address carries no provenance.
    ///
    /// # Safety
    ///
    /// As [`CudaStream::from_raw`].
    #[must_use]
    pub unsafe fn from_usize(raw: usize) -> Self {
        CudaStream(ptr::without_provenance_mut(raw))
    }
}

/// An instantiated graph: the captured `CUgraph` and its executable `CUgraphExec`, both owned
/// and destroyed together by [`Backend::graph_destroy`](gpumem_core::Backend::graph_destroy).
/// It is the [`Backend::Graph`](gpumem_core::Backend::Graph) of [`Cuda`](crate::Cuda).
#[derive(Debug)]
pub struct CudaGraph {
    graph: CUgraph,
    exec: CUgraphExec,
}

// SAFETY: the handles name driver objects that Rust never dereferences. The driver serialises
// its own use of them; launching and uploading from several threads at once is allowed by CUDA
// (launches of one executable graph are ordered by the streams they go to), and destroying takes
// the value by move, so it happens once, after every borrow.
unsafe impl Send for CudaGraph {}
// SAFETY: as for `Send`: `&CudaGraph` only allows launches and uploads.
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// The captured graph (`CUgraph`), for inspection with the driver (`cuGraphDebugDotPrint`).
    #[must_use]
    pub fn graph(&self) -> CUgraph {
        self.graph
    }

    /// The executable graph (`CUgraphExec`).
    #[must_use]
    pub fn exec(&self) -> CUgraphExec {
        self.exec
    }
}

/// The device's stream priority range as `(least, greatest)`.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn priority_range(dev: DeviceId) -> Result<(i32, i32)> {
    make_current(dev)?;
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: `dev`'s context is current; both are valid out-pointers.
    check("cuCtxGetStreamPriorityRange", unsafe {
        sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
    })?;
    Ok((least, greatest))
}

/// Creates a stream in `dev`'s primary context.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<CudaStream> {
    make_current(dev)?;
    let bits = if flags.non_blocking {
        sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint
    } else {
        sys::CUstream_flags::CU_STREAM_DEFAULT as c_uint
    };
    let mut stream: CUstream = ptr::null_mut();
    // SAFETY: `dev`'s context is current; `stream` is a valid out-pointer; the flags are the
    // driver's.
    check("cuStreamCreateWithPriority", unsafe {
        sys::cuStreamCreateWithPriority(&mut stream, bits, priority)
    })?;
    Ok(CudaStream(stream))
}

/// Destroys a stream; work already queued on it still runs.
///
/// # Safety
///
/// The handle came from [`create`] and is destroyed once.
///
/// # Errors
///
/// The driver's error.
pub(crate) unsafe fn destroy(dev: DeviceId, stream: CudaStream) -> Result<()> {
    make_current(dev)?;
    // SAFETY: the caller guarantees a live stream of ours, destroyed once.
    check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(stream.0) })
}

/// The stream's creation flags.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn flags(dev: DeviceId, stream: CudaStream) -> Result<StreamFlags> {
    make_current(dev)?;
    let mut bits: c_uint = 0;
    // SAFETY: a context is current; the handle is live (the contract); `bits` is a valid
    // out-pointer.
    check("cuStreamGetFlags", unsafe { sys::cuStreamGetFlags(stream.0, &mut bits) })?;
    Ok(StreamFlags { non_blocking: bits & (sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint) != 0 })
}

/// The stream's priority.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn priority(dev: DeviceId, stream: CudaStream) -> Result<i32> {
    make_current(dev)?;
    let mut priority: c_int = 0;
    // SAFETY: a context is current; the handle is live; `priority` is a valid out-pointer.
    check("cuStreamGetPriority", unsafe { sys::cuStreamGetPriority(stream.0, &mut priority) })?;
    Ok(priority)
}

/// `Ok(true)` when the stream's work is done, `Ok(false)` while some is pending.
///
/// # Errors
///
/// The driver's error (querying a capturing stream is one, and invalidates the capture).
pub(crate) fn query(dev: DeviceId, stream: CudaStream) -> Result<bool> {
    make_current(dev)?;
    // SAFETY: a context is current; the handle is live.
    let r = unsafe { sys::cuStreamQuery(stream.0) };
    match code(r) {
        SUCCESS => Ok(true),
        ERROR_NOT_READY => Ok(false),
        _ => Err(result::error("cuStreamQuery", r)),
    }
}

/// Waits for the stream's work.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn synchronize(dev: DeviceId, stream: CudaStream) -> Result<()> {
    make_current(dev)?;
    // SAFETY: a context is current; the handle is live.
    check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream.0) })
}

/// Makes the stream's future work wait for the event's last record.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn wait_event(dev: DeviceId, stream: CudaStream, event: &CudaEvent) -> Result<()> {
    make_current(dev)?;
    // SAFETY: a context is current; both handles are live; the flags must be 0.
    check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.0, event.as_raw(), 0) })
}

/// Queues `func(data)` on the stream (`cuLaunchHostFunc`); capturable.
///
/// # Safety
///
/// `func` does not unwind; `data` stays valid for every call the driver makes.
///
/// # Errors
///
/// The driver's error.
pub(crate) unsafe fn launch_host_func(
    dev: DeviceId,
    stream: CudaStream,
    func: HostFn,
    data: *mut c_void,
) -> Result<()> {
    make_current(dev)?;
    // SAFETY: a context is current; the handle is live; `HostFn` is exactly the function type
    // `CUhostFn` wraps, and the caller guarantees `func` does not unwind and `data` stays valid.
    check("cuLaunchHostFunc", unsafe { sys::cuLaunchHostFunc(stream.0, Some(func), data) })
}

/// Queues a one-shot callback (`cuStreamAddCallback`), given the stream's status when it runs.
///
/// # Errors
///
/// The driver's error; the callback is then dropped without running.
pub(crate) fn add_callback(dev: DeviceId, stream: CudaStream, callback: StreamCallback) -> Result<()> {
    make_current(dev)?;
    // A thin pointer for the driver: the callback is a fat `Box<dyn FnOnce>`.
    let data = Box::into_raw(Box::new(callback)).cast::<c_void>();
    // SAFETY: a context is current; the handle is live; the trampoline has the driver's callback
    // type and takes ownership of `data`, which the driver passes to it once; the flags must be 0.
    let r = unsafe { sys::cuStreamAddCallback(stream.0, Some(callback_trampoline), data, 0) };
    if code(r) != SUCCESS {
        // SAFETY: the driver refused the callback, so it will never call the trampoline: `data`
        // is still the box made above, and ours to drop.
        drop(unsafe { Box::from_raw(data.cast::<StreamCallback>()) });
        return Err(result::error("cuStreamAddCallback", r));
    }
    Ok(())
}

/// Runs a callback queued by [`add_callback`] on the driver's thread.
///
/// Nothing unwinds out of it: the callback and its drop run inside `catch_unwind` (the typed
/// layer's callbacks already catch their panics; this is the last line), and a caught payload is
/// leaked rather than dropped, since its drop could panic too.
///
/// CUDA forbids driver calls in callbacks because they could wait on the stream's own work. The
/// one made here for an error status, `cuGetErrorName`/`cuGetErrorString`, only looks the code up
/// in the driver's static tables; if the driver refused it, the error would carry a plain name.
/// The status is never matched as a Rust enum: a newer driver may report codes the 12.0 bindings
/// do not declare (`CUDA_ERROR_CONTAINED`, for one).
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<StreamCallback>)` in [`add_callback`] and is passed here
/// once (the driver calls each callback once).
unsafe extern "C" fn callback_trampoline(_stream: CUstream, status: CUresult, data: *mut c_void) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: guaranteed by the caller (see above): we take back the box `add_callback` gave
        // out.
        let callback = unsafe { Box::from_raw(data.cast::<StreamCallback>()) };
        let status = check("cuStreamAddCallback", status);
        callback(status);
    }));
    if let Err(payload) = outcome {
        std::mem::forget(payload);
    }
}

/// Starts capturing the stream's work (`cuStreamBeginCapture`) in `mode`.
///
/// # Errors
///
/// The driver's error (the legacy stream cannot capture, nor can a stream already capturing).
pub(crate) fn begin_capture(dev: DeviceId, stream: CudaStream, mode: CaptureMode) -> Result<()> {
    make_current(dev)?;
    let mode = match mode {
        CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    };
    // SAFETY: a context is current; the handle is live; `mode` is a variant of the binding's enum.
    check("cuStreamBeginCapture_v2", unsafe { sys::cuStreamBeginCapture_v2(stream.0, mode) })
}

/// Ends the capture (`cuStreamEndCapture`) and instantiates the graph
/// (`cuGraphInstantiateWithFlags` with flags 0, as CuPy does on CUDA 12).
///
/// # Errors
///
/// The driver's error: not capturing, capture invalidated, unjoined work, or a failed
/// instantiation (the captured graph is then destroyed).
pub(crate) fn end_capture(dev: DeviceId, stream: CudaStream) -> Result<CudaGraph> {
    make_current(dev)?;
    let mut graph: CUgraph = ptr::null_mut();
    // SAFETY: a context is current; the handle is live; `graph` is a valid out-pointer.
    let r = unsafe { sys::cuStreamEndCapture(stream.0, &mut graph) };
    if code(r) != SUCCESS {
        if !graph.is_null() {
            // SAFETY: a graph the driver handed out despite the error is ours to destroy, once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
        }
        return Err(result::error("cuStreamEndCapture", r));
    }
    let mut exec: CUgraphExec = ptr::null_mut();
    // SAFETY: `graph` is the graph just captured; `exec` is a valid out-pointer; flags 0.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    if code(r) != SUCCESS {
        // SAFETY: the graph is ours and nothing else refers to it; destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
        return Err(result::error("cuGraphInstantiateWithFlags", r));
    }
    Ok(CudaGraph { graph, exec })
}

/// The stream's capture status (`cuStreamIsCapturing`).
///
/// # Errors
///
/// The driver's error, for instance `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for the legacy stream
/// while a blocking stream captures.
pub(crate) fn capture_status(dev: DeviceId, stream: CudaStream) -> Result<CaptureStatus> {
    make_current(dev)?;
    // The driver writes a C enum (an `unsigned int`): read it as that integer.
    let mut status: c_uint = 0;
    // SAFETY: a context is current; the handle is live; `status` has the size and alignment of
    // the C enum the driver writes.
    let r = unsafe {
        sys::cuStreamIsCapturing(stream.0, (&mut status as *mut c_uint).cast::<CUstreamCaptureStatus>())
    };
    check("cuStreamIsCapturing", r)?;
    match status {
        0 => Ok(CaptureStatus::None),
        1 => Ok(CaptureStatus::Active),
        2 => Ok(CaptureStatus::Invalidated),
        other => Err(Error::backend(
            BACKEND,
            "cuStreamIsCapturing",
            i64::from(other),
            "CU_STREAM_CAPTURE_STATUS_UNKNOWN",
            format!("the driver reported capture status {other}, which this backend does not know"),
        )),
    }
}

/// Launches the graph on the stream.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn graph_launch(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
    make_current(dev)?;
    // SAFETY: a context is current; the executable graph is live while borrowed; the stream
    // handle is live.
    check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(graph.exec, stream.0) })
}

/// Uploads the graph's resources ahead of its first launch, ordered on the stream.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn graph_upload(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
    make_current(dev)?;
    // SAFETY: as for `graph_launch`.
    check("cuGraphUpload", unsafe { sys::cuGraphUpload(graph.exec, stream.0) })
}

/// Destroys the executable graph and the graph; launches already queued still run.
///
/// # Errors
///
/// The first of the driver's errors; both are destroyed regardless.
pub(crate) fn graph_destroy(dev: DeviceId, graph: CudaGraph) -> Result<()> {
    // The handles carry their context: destroy them even if it could not be made current (the
    // driver is loaded, since the graph exists).
    let current = make_current(dev).map(drop);
    // SAFETY: the executable graph is ours, taken by value, destroyed once.
    let exec = check("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(graph.exec) });
    // SAFETY: as above, for the graph; the executable form no longer refers to it.
    let captured = check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph.graph) });
    current.and(exec).and(captured)
}
