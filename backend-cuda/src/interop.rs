//! Interop with [cudarc](https://docs.rs/cudarc/0.19) (the `cudarc` feature): gpumem streams as
//! cudarc streams and back, gpumem memory as cudarc slices that never free, and typed buffers as
//! kernel arguments.
//!
//! Both name the same driver objects: gpumem runs in each device's primary context, which
//! [`context`] hands out as cudarc's [`CudaContext`]; streams and device pointers are the driver's
//! own handles on both sides.
//!
//! # Who frees what
//!
//! - A gpumem stream seen by cudarc ([`with_cudarc_stream`]) is a cudarc *borrowed* stream, which
//!   cudarc never destroys; gpumem destroys it when its last [`Stream`] is dropped, and if cudarc
//!   still holds the handle then, the gpumem stream is kept alive for the rest of the process
//!   instead, so the handle never dangles.
//! - A cudarc stream seen by gpumem ([`stream_from_cudarc`]) is an external gpumem stream, which
//!   gpumem never destroys; it holds cudarc's `Arc`, so cudarc destroys the stream (once) when
//!   both sides are done with it.
//! - gpumem memory seen by cudarc ([`CudarcSlice`]) is never freed by cudarc.
//!
//! # The `upgrade_device_ptr` pitfall
//!
//! cudarc's `CudaStream::upgrade_device_ptr` makes a `CudaSlice` that *owns* the address: when it
//! is dropped, cudarc frees the memory with `cuMemFreeAsync`. Given a pointer from gpumem's pool,
//! that frees memory the pool still owns, and the pool later hands it out again or frees it a
//! second time. The slice must instead be given up with `CudaSlice::leak`, on every path, panics
//! included. [`CudarcSlice`] does exactly that in its `Drop`, and gives out only shared access
//! to the `CudaSlice` (a `&mut` would let the slice be swapped out and dropped), so it cannot be
//! forgotten.
//!
//! # Ordering and lifetimes
//!
//! As with gpumem's own asynchronous operations, work queued through cudarc on memory from
//! gpumem's pool must be ordered with that memory's reuse: the memory (the [`DeviceBuffer`] or
//! [`MemoryPointer`]) stays alive until the stream has run the work, or the work runs on the
//! stream the memory was allocated on (the pool reuses a freed chunk in that stream's order).
//!
//! ```no_run
//! use gpumem_core::{DeviceBuffer, Stream};
//! use gpumem_cuda::interop::{self, kernel_arg};
//! use gpumem_cuda::Cuda;
//!
//! let data = DeviceBuffer::<f32, Cuda>::from_slice(&[1.0, 2.0, 3.0])?;
//! let stream = Stream::<Cuda>::non_blocking()?;
//! interop::with_cudarc_stream(&stream, |cs| {
//!     // Launch a kernel on `cs` with `kernel_arg(&data)`; see examples/07-cudarc-interop.rs.
//!     let _ = (cs, kernel_arg(&data));
//!     Ok(())
//! })?;
//! # Ok::<(), gpumem_core::Error>(())
//! ```

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, PoisonError};

use bytemuck::Pod;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream as CudarcStream, DriverError, LaunchArgs, PushKernelArg,
};
use gpumem_core::{DeviceBuffer, DeviceId, Error, MemoryPointer, Result, Stream};

use crate::result::BACKEND;
use crate::{Cuda, CudaStream};

/// cudarc's driver error as gpumem's: [`Error::Backend`] for the call `api`, with the code and the
/// driver's name and text.
#[must_use]
pub fn driver_error(api: &'static str, e: &DriverError) -> Error {
    let name =
        e.error_name().map_or_else(|_| "CUresult (unnamed)".to_owned(), |s| s.to_string_lossy().into_owned());
    let message = e.error_string().map_or_else(|_| e.to_string(), |s| s.to_string_lossy().into_owned());
    Error::backend(BACKEND, api, i64::from(e.0 as i32), name, message)
}

/// Device `dev`'s primary context as cudarc's [`CudaContext`]: the context gpumem runs in. Made
/// once per device and kept for the process, as gpumem keeps the primary contexts it retains.
///
/// # Errors
///
/// gpumem's errors for the device (`DriverNotFound`, `NoDevice`, `NoSuchDevice`); cudarc's, as
/// [`Error::Backend`].
pub fn context(dev: DeviceId) -> Result<Arc<CudaContext>> {
    static CONTEXTS: Mutex<Vec<Option<Arc<CudaContext>>>> = Mutex::new(Vec::new());
    // The device must exist for gpumem (and its driver be started) before cudarc is asked.
    crate::device::make_current(dev)?;
    let index = usize::try_from(dev).map_err(|_| Error::InvalidArgument(format!("device id {dev}")))?;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    if contexts.len() <= index {
        contexts.resize(index + 1, None);
    }
    if let Some(ctx) = &contexts[index] {
        return Ok(Arc::clone(ctx));
    }
    let ctx = CudaContext::new(index).map_err(|e| driver_error("CudaContext::new", &e))?;
    contexts[index] = Some(Arc::clone(&ctx));
    Ok(ctx)
}

/// Runs `f` with `stream` as a cudarc stream (borrowed: cudarc never destroys it), for launching
/// kernels or any cudarc call on gpumem's stream.
///
/// If `f` lets the cudarc stream escape (a clone of the `Arc`, or a `CudaSlice` or event that
/// holds it), gpumem keeps its stream alive for the rest of the process, so the handle cudarc
/// holds never dangles; nothing is destroyed twice in either case.
///
/// The null stream is cudarc's default stream, and gpumem's per-thread stream cudarc's
/// per-thread stream.
///
/// # Errors
///
/// `InvalidArgument` for a stream of no device (a foreign stream wrapped without one); the
/// context's errors; what `f` returns.
pub fn with_cudarc_stream<R>(
    stream: &Stream<Cuda>,
    f: impl FnOnce(&Arc<CudarcStream>) -> Result<R>,
) -> Result<R> {
    let dev = stream
        .device_id()
        .ok_or_else(|| Error::InvalidArgument("with_cudarc_stream: the stream has no device".into()))?;
    let ctx = context(dev)?;
    // SAFETY: the handle is a live stream of `dev`'s primary context (`ctx`), kept alive by
    // `stream` for the call and, if cudarc keeps it past the call, for the process (below).
    let borrowed = unsafe { ctx.wrap_borrowed_stream(stream.handle().as_raw().cast()) };
    let result = f(&borrowed);
    if Arc::strong_count(&borrowed) > 1 || Arc::weak_count(&borrowed) > 0 {
        // cudarc keeps the handle: never let gpumem destroy the stream.
        std::mem::forget(stream.clone());
    }
    result
}

/// A cudarc stream as a gpumem [`Stream`] that keeps cudarc's `Arc` alive and never destroys the
/// handle itself: cudarc destroys a stream it owns once, when the last `Arc` (this stream's
/// included) is dropped.
///
/// # Errors
///
/// `InvalidArgument` when the stream's context is not its device's primary context (gpumem runs
/// every operation in the primary context, so it cannot use streams of another).
pub fn stream_from_cudarc(stream: &Arc<CudarcStream>) -> Result<Stream<Cuda>> {
    if !stream.context().is_primary() {
        return Err(Error::InvalidArgument(
            "stream_from_cudarc: the cudarc stream belongs to a non-primary context; gpumem uses primary contexts".into(),
        ));
    }
    let dev = DeviceId::try_from(stream.context().ordinal())
        .map_err(|_| Error::InvalidArgument("stream_from_cudarc: device ordinal out of range".into()))?;
    // SAFETY: `raw` is the handle of a live cudarc stream in `dev`'s primary context; cudarc
    // destroys it (if it owns it) only when the last `Arc` is dropped, and the owner passed here
    // is one of them, held as long as the gpumem stream.
    let handle = unsafe { CudaStream::from_raw(stream.cu_stream().cast()) };
    let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(Arc::clone(stream));
    // SAFETY: as above: the handle stays live while `owner` lives.
    Ok(unsafe { Stream::from_external(handle, Some(dev), owner) })
}

/// gpumem memory as a cudarc [`CudaSlice`] that cudarc never frees: shared access to the slice
/// (pass `&*slice` to a kernel launch, to cudarc's copies), a mutable view through
/// [`view_mut`](CudarcSlice::view_mut), and `CudaSlice::leak` when dropped. It borrows the gpumem
/// memory, which outlives it.
pub struct CudarcSlice<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _memory: PhantomData<&'a MemoryPointer<Cuda>>,
}

impl<T> std::fmt::Debug for CudarcSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudarcSlice").field("len", &self.slice.len()).finish_non_exhaustive()
    }
}

impl<'a, T: Pod> CudarcSlice<'a, T> {
    /// The elements of `buffer` as a cudarc slice on `stream` (cudarc orders its own copies and
    /// launches on that slice's stream).
    #[must_use]
    pub fn new(buffer: &'a DeviceBuffer<T, Cuda>, stream: &Arc<CudarcStream>) -> Self {
        // SAFETY: the address and length are the buffer's, which `'a` keeps alive; the memory is
        // valid for `T` (any bits are, `T: Pod`); the slice is never dropped as a `CudaSlice`
        // (it is leaked in `Drop`), so cudarc never frees the memory.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(buffer.device_ptr() as u64, buffer.len()) };
        CudarcSlice { slice: ManuallyDrop::new(slice), _memory: PhantomData }
    }

    /// A mutable cudarc view of the elements, for kernels and copies that write them.
    pub fn view_mut(&mut self) -> cudarc::driver::CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl<T> std::ops::Deref for CudarcSlice<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> Drop for CudarcSlice<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used afterwards.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Gives the address up without freeing it (cudarc drops its events and stream handle).
        let _ = slice.leak();
    }
}

/// A typed buffer as a kernel argument: the device address of its first element, passed to a
/// cudarc launch with `.arg(&arg)` as a `T*` parameter.
///
/// The launch is asynchronous: keep the buffer alive until the stream has run the kernel, or
/// launch on the stream the buffer was allocated on (see the [module docs](self)).
#[derive(Debug)]
pub struct KernelArg<'a, T> {
    ptr: u64,
    _buffer: Borrow<'a, T>,
}

/// What a [`KernelArg`] borrows: the buffer's memory, for elements of `T`.
type Borrow<'a, T> = PhantomData<(&'a MemoryPointer<Cuda>, fn() -> T)>;

/// The kernel argument for `buffer`'s elements (`T*` in the kernel).
#[must_use]
pub fn kernel_arg<T: Pod>(buffer: &DeviceBuffer<T, Cuda>) -> KernelArg<'_, T> {
    KernelArg { ptr: buffer.device_ptr() as u64, _buffer: PhantomData }
}

// SAFETY: the argument pushed is a `u64` device address that lives in `arg`, which the launch
// borrows for as long as the builder (`'b: 'a`), as cudarc's own `&T` arguments do.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b KernelArg<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b KernelArg<'c, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}
