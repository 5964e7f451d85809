//! Events: markers in a stream's work, for waiting, ordering streams and timing.

use std::ptr;

use crate::sys::{self, CUevent};
use gpumem_core::{DeviceId, EventFlags, EventOps, Result};

use crate::device::make_current;
use crate::legacy;
use crate::result::{self, check, code, ERROR_NOT_READY, SUCCESS};
use crate::stream::CudaStream;
use crate::Cuda;

/// A CUDA event (`CUevent`): the [`Api::Event`](gpumem_core::Api::Event) of
/// [`Cuda`](crate::Cuda). Owned by gpumem's typed `Event`, which destroys it once.
#[derive(Debug)]
pub struct CudaEvent(CUevent);

// SAFETY: a `CUevent` is a handle to a driver object, never dereferenced by Rust; the CUDA driver
// API is thread-safe and serialises every use of an event internally, so it may be recorded,
// queried and waited on from any thread. Destruction takes the value by move, so it happens once,
// after every borrow.
unsafe impl Send for CudaEvent {}
// SAFETY: as for `Send`: `&CudaEvent` only allows record, query, wait and timing calls.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// The raw handle, for calls into the driver or other CUDA libraries.
    #[must_use]
    pub fn as_raw(&self) -> CUevent {
        self.0
    }
}

impl EventOps for Cuda {
    /// Creates an event in `dev`'s primary context, with the driver's flag bits (blocking sync 1,
    /// disable timing 2, interprocess 4, which are gpumem's).
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<CudaEvent> {
        make_current(dev)?;
        let mut event: CUevent = ptr::null_mut();
        // SAFETY: `dev`'s context is current; `event` is a valid out-pointer; `EventFlags::bits` uses
        // CUDA's values for the three flags.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags.bits()) })?;
        Ok(CudaEvent(event))
    }

    /// Destroys an event.
    ///
    /// # Errors
    ///
    /// The driver's error; the event is gone regardless.
    fn event_destroy(dev: DeviceId, event: CudaEvent) -> Result<()> {
        // The handle carries its context: destroy it even if that could not be made current (the
        // driver is loaded, since the event exists).
        let current = make_current(dev).map(drop);
        // SAFETY: the event is ours, taken by value, destroyed once.
        let destroyed = check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(event.0) });
        current.and(destroyed)
    }

    /// Records the event at the current end of the stream's work.
    ///
    /// # Errors
    ///
    /// The driver's error (an event and a stream of different contexts, for one).
    unsafe fn event_record(dev: DeviceId, event: &CudaEvent, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuEventRecord", dev, stream)?;
        // SAFETY: a context is current; the event is live while borrowed; the stream handle is live.
        check("cuEventRecord", unsafe { sys::cuEventRecord(event.0, stream.as_raw()) })
    }

    /// `Ok(true)` when the work before the last record is done (or the event was never recorded).
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn event_query(dev: DeviceId, event: &CudaEvent) -> Result<bool> {
        make_current(dev)?;
        // SAFETY: a context is current; the event is live while borrowed.
        let r = unsafe { sys::cuEventQuery(event.0) };
        match code(r) {
            SUCCESS => Ok(true),
            ERROR_NOT_READY => Ok(false),
            _ => Err(result::error("cuEventQuery", r)),
        }
    }

    /// Waits for the work before the last record.
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn event_synchronize(dev: DeviceId, event: &CudaEvent) -> Result<()> {
        make_current(dev)?;
        // SAFETY: a context is current; the event is live while borrowed.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(event.0) })
    }

    /// Milliseconds between two recorded, completed, timing-enabled events.
    ///
    /// # Errors
    ///
    /// The driver's error: `CUDA_ERROR_INVALID_HANDLE` for an event never recorded or without
    /// timing, `CUDA_ERROR_NOT_READY` for one not yet complete.
    fn event_elapsed_ms(dev: DeviceId, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        make_current(dev)?;
        let mut ms: f32 = 0.0;
        // SAFETY: a context is current; both events are live while borrowed; `ms` is a valid
        // out-pointer.
        check("cuEventElapsedTime", unsafe { sys::cuEventElapsedTime(&mut ms, start.0, end.0) })?;
        Ok(ms)
    }
}
