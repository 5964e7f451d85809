//! Legacy-stream work beside the capture of a blocking stream.
//!
//! While a blocking stream (one created without `CU_STREAM_NON_BLOCKING`, or the per-thread
//! default stream) captures, CUDA refuses work on the legacy stream of its device with
//! `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`. Driver 580.159 (CUDA 13, on an H200) does not always get
//! that far: a legacy-stream memset or stream query on one thread while another thread begins
//! and ends such captures crashes the process (a segmentation fault in the driver; plain CUDA
//! reproduces it, see `scripts/cuda-capture-rules/legacy-race.cu`). So this backend gives that
//! error itself, without calling the driver:
//!
//! - every call that works on or waits for the legacy stream counts itself in flight for as long
//!   as it is in the driver, and is refused while this backend has begun a capture of a blocking
//!   stream of the same device that has not ended;
//! - such a capture is begun only once no legacy-stream call is in flight.
//!
//! The refusal leaves the capture as it was (the driver's own refusal invalidates it). Captures
//! begun elsewhere (a foreign library's, through a raw handle) are not seen.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpumem_core::{DeviceId, Result};

use crate::result;
use crate::stream::CudaStream;

/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
const ERROR_STREAM_CAPTURE_IMPLICIT: i32 = 906;

/// A capture of a blocking stream this backend began: its device, and its stream (the raw
/// handle, and for the per-thread default stream, whose handle is the same on every thread, the
/// thread).
type Capture = (DeviceId, usize, u64);

/// The captures of blocking streams under way.
static CAPTURES: Mutex<Vec<Capture>> = Mutex::new(Vec::new());
/// `CAPTURES.len()`, read without the lock.
static N_CAPTURES: AtomicUsize = AtomicUsize::new(0);
/// Legacy-stream calls in the driver now.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

fn captures() -> MutexGuard<'static, Vec<Capture>> {
    CAPTURES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether work on `stream` is legacy-stream work (the null handle is the legacy stream here).
fn is_legacy(stream: CudaStream) -> bool {
    stream == CudaStream::NULL || stream == CudaStream::LEGACY
}

/// The calling thread, for the per-thread default stream's captures: the address of a
/// thread-local without a destructor, which stays readable while the thread's other
/// thread-locals are torn down (a capture left on that stream is ended then).
fn thread_key() -> u64 {
    thread_local! {
        static ANCHOR: u8 = const { 0 };
    }
    ANCHOR.with(|a| std::ptr::from_ref(a).addr() as u64)
}

fn key(dev: DeviceId, stream: CudaStream) -> Capture {
    let thread = if stream == CudaStream::PER_THREAD { thread_key() } else { 0 };
    (dev, stream.to_usize(), thread)
}

/// A legacy-stream call in flight; ends when dropped.
#[must_use]
pub(crate) struct InFlight(bool);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0 {
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Enters a call `api` on `stream` of device `dev`: refused when it is legacy-stream work while
/// a blocking stream of `dev` captures. Hold the value while the driver call runs.
///
/// # Errors
///
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, as the driver names it.
pub(crate) fn enter(api: &'static str, dev: DeviceId, stream: CudaStream) -> Result<InFlight> {
    if !is_legacy(stream) {
        return Ok(InFlight(false));
    }
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let call = InFlight(true);
    if N_CAPTURES.load(Ordering::SeqCst) > 0 && captures().iter().any(|c| c.0 == dev) {
        return Err(result::error(api, ERROR_STREAM_CAPTURE_IMPLICIT));
    }
    Ok(call)
}

/// Begins a capture of `stream` with `begin`: for a blocking stream, registered first and begun
/// once no legacy-stream call is in flight.
///
/// # Errors
///
/// What `begin` returns (the registration is then undone).
pub(crate) fn begin_capture(
    dev: DeviceId,
    stream: CudaStream,
    blocking: bool,
    begin: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if !blocking {
        return begin();
    }
    let capture = key(dev, stream);
    {
        let mut list = captures();
        list.push(capture);
        N_CAPTURES.store(list.len(), Ordering::SeqCst);
    }
    // Calls that entered before the registration finish first; later ones see it.
    while IN_FLIGHT.load(Ordering::SeqCst) > 0 {
        std::thread::yield_now();
    }
    let begun = begin();
    if begun.is_err() {
        ended(dev, stream);
    }
    begun
}

/// The capture of `stream` is over (ended, or the stream destroyed).
pub(crate) fn ended(dev: DeviceId, stream: CudaStream) {
    let capture = key(dev, stream);
    let mut list = captures();
    if let Some(i) = list.iter().position(|c| *c == capture) {
        list.swap_remove(i);
    }
    N_CAPTURES.store(list.len(), Ordering::SeqCst);
}
