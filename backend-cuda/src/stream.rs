//! Streams, host functions and callbacks.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::sys::{self, CUresult, CUstream, CUstream_st};
use gpumem_core::{DeviceId, HostFn, Result, StreamCallback, StreamFlags, StreamOps};

use crate::device::make_current;
use crate::event::CudaEvent;
use crate::legacy;
use crate::result::{self, check, code, ERROR_NOT_READY, SUCCESS};
use crate::Cuda;

/// A CUDA stream handle (`CUstream`): the [`Api::Stream`](gpumem_core::Api::Stream) of
/// [`Cuda`](crate::Cuda).
///
/// Plain data: copying it does not duplicate the stream, and dropping it destroys nothing. Besides
/// streams the driver created, it holds the driver's three special handles: [`CudaStream::NULL`]
/// (0, the context's default stream, which is the legacy stream), [`CudaStream::LEGACY`] (1,
/// `CU_STREAM_LEGACY`) and [`CudaStream::PER_THREAD`] (2, `CU_STREAM_PER_THREAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream(pub(crate) CUstream);

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

/// Runs a callback queued by [`add_callback`] on the driver's thread.
///
/// Nothing unwinds out of it: the callback and its drop run inside `catch_unwind` (the typed
/// layer's callbacks already catch their panics; this is the last line), and a caught payload is
/// leaked rather than dropped, since its drop could panic too.
///
/// CUDA forbids driver calls in callbacks because they could wait on the stream's own work. The
/// one made here for an error status, `cuGetErrorName`/`cuGetErrorString`, only looks the code up
/// in the driver's static tables; if the driver refused it, the error would carry a plain name.
/// The status arrives as the integer `CUresult` (the callback type is declared so), so a code a
/// newer driver adds (`CUDA_ERROR_CONTAINED`, for one) is an ordinary value.
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

impl StreamOps for Cuda {
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

    /// The device's stream priority range as `(least, greatest)`.
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
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
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<CudaStream> {
        make_current(dev)?;
        let bits = if flags.non_blocking { sys::CU_STREAM_NON_BLOCKING } else { sys::CU_STREAM_DEFAULT };
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
    /// The handle came from [`Self::stream_create`] and is destroyed once.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn stream_destroy(dev: DeviceId, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        legacy::ended(dev, stream);
        // SAFETY: the caller guarantees a live stream of ours, destroyed once.
        check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(stream.0) })
    }

    /// The stream's creation flags.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn stream_flags(dev: DeviceId, stream: CudaStream) -> Result<StreamFlags> {
        make_current(dev)?;
        let mut bits: c_uint = 0;
        // SAFETY: a context is current; the handle is live (the contract); `bits` is a valid
        // out-pointer.
        check("cuStreamGetFlags", unsafe { sys::cuStreamGetFlags(stream.0, &mut bits) })?;
        Ok(StreamFlags { non_blocking: bits & (sys::CU_STREAM_NON_BLOCKING) != 0 })
    }

    /// The stream's priority.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn stream_priority(dev: DeviceId, stream: CudaStream) -> Result<i32> {
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
    unsafe fn stream_query(dev: DeviceId, stream: CudaStream) -> Result<bool> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuStreamQuery", dev, stream)?;
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
    unsafe fn stream_synchronize(dev: DeviceId, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuStreamSynchronize", dev, stream)?;
        // SAFETY: a context is current; the handle is live.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream.0) })
    }

    /// Makes the stream's future work wait for the event's last record.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn stream_wait_event(dev: DeviceId, stream: CudaStream, event: &CudaEvent) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuStreamWaitEvent", dev, stream)?;
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
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: CudaStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuLaunchHostFunc", dev, stream)?;
        // SAFETY: a context is current; the handle is live; `HostFn` is exactly the function type
        // `CUhostFn` wraps, and the caller guarantees `func` does not unwind and `data` stays valid.
        check("cuLaunchHostFunc", unsafe { sys::cuLaunchHostFunc(stream.0, Some(func), data) })
    }

    /// Queues a one-shot callback (`cuStreamAddCallback`), given the stream's status when it runs.
    ///
    /// # Errors
    ///
    /// The driver's error; the callback is then dropped without running.
    unsafe fn add_callback(dev: DeviceId, stream: CudaStream, callback: StreamCallback) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuStreamAddCallback", dev, stream)?;
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
}
