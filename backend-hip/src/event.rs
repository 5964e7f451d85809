//! Events: markers in a stream's work, for waiting, ordering streams and timing.

use std::ptr;

use gpumem_core::{DeviceId, EventFlags, EventOps, Result};
use hip_sys::hiprt::hipEvent_t;

use crate::device::make_current;
use crate::result::{self, check, sys, ERROR_NOT_READY, SUCCESS};
use crate::stream::HipStream;
use crate::Hip;

/// A HIP event (`hipEvent_t`): the [`Api::Event`](gpumem_core::Api::Event) of
/// [`Hip`](crate::Hip). Owned by gpumem's typed `Event`, which destroys it once.
#[derive(Debug)]
pub struct HipEvent(hipEvent_t);

// SAFETY: a `hipEvent_t` is a handle to a runtime object, never dereferenced by Rust; the HIP
// runtime is thread-safe and locks its own event state, so it may be recorded, queried and waited
// on from any thread. Destruction takes the value by move, so it happens once, after every
// borrow.
unsafe impl Send for HipEvent {}
// SAFETY: as for `Send`: `&HipEvent` only allows record, query, wait and timing calls.
unsafe impl Sync for HipEvent {}

impl HipEvent {
    /// The raw handle, for calls into the runtime or other HIP libraries.
    #[must_use]
    pub fn as_raw(&self) -> hipEvent_t {
        self.0
    }
}

impl EventOps for Hip {
    /// Creates an event on `dev`, with HIP's flag bits (`hipEventBlockingSync` 1,
    /// `hipEventDisableTiming` 2, `hipEventInterprocess` 4, which are gpumem's and CUDA's).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<HipEvent> {
        make_current(dev)?;
        let mut event: hipEvent_t = ptr::null_mut();
        // SAFETY: `dev` is current; `event` is a valid out-pointer; `EventFlags::bits` uses HIP's
        // values for the three flags (a unit test compares them with hip-sys's constants).
        check("hipEventCreateWithFlags", unsafe { sys::hipEventCreateWithFlags(&mut event, flags.bits()) })?;
        Ok(HipEvent(event))
    }

    /// Destroys an event.
    ///
    /// # Errors
    ///
    /// The runtime's error; the event is gone regardless.
    fn event_destroy(dev: DeviceId, event: HipEvent) -> Result<()> {
        // Destroy it even if its device could not be made current: HIP events belong to their
        // device, not to the current one, and the runtime is there, since the event exists.
        let current = make_current(dev).map(drop);
        // SAFETY: the event is ours, taken by value, destroyed once.
        let destroyed = check("hipEventDestroy", unsafe { sys::hipEventDestroy(event.0) });
        current.and(destroyed)
    }

    /// Records the event at the current end of the stream's work.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn event_record(dev: DeviceId, event: &HipEvent, stream: HipStream) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the event is live while borrowed; the stream handle is live.
        check("hipEventRecord", unsafe { sys::hipEventRecord(event.0, stream.as_raw()) })
    }

    /// `Ok(true)` when the work before the last record is done (or the event was never recorded).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_query(dev: DeviceId, event: &HipEvent) -> Result<bool> {
        make_current(dev)?;
        // SAFETY: the event is live while borrowed.
        match unsafe { sys::hipEventQuery(event.0) } {
            SUCCESS => Ok(true),
            ERROR_NOT_READY => Ok(false),
            code => Err(result::error("hipEventQuery", code)),
        }
    }

    /// Waits for the work before the last record.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_synchronize(dev: DeviceId, event: &HipEvent) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the event is live while borrowed.
        check("hipEventSynchronize", unsafe { sys::hipEventSynchronize(event.0) })
    }

    /// Milliseconds between two recorded, completed, timing-enabled events.
    ///
    /// # Errors
    ///
    /// The runtime's error: for an event never recorded or without timing, or one not yet complete
    /// (`hipErrorNotReady`).
    fn event_elapsed_ms(dev: DeviceId, start: &HipEvent, end: &HipEvent) -> Result<f32> {
        make_current(dev)?;
        let mut ms: f32 = 0.0;
        // SAFETY: both events are live while borrowed; `ms` is a valid out-pointer.
        check("hipEventElapsedTime", unsafe { sys::hipEventElapsedTime(&mut ms, start.0, end.0) })?;
        Ok(ms)
    }
}

#[cfg(test)]
mod tests {
    use hip_sys::hiprt::{hipEventBlockingSync, hipEventDisableTiming, hipEventInterprocess};

    use super::*;

    #[test]
    fn event_flag_bits_are_hips() {
        let flag = |blocking, disable_timing, interprocess| {
            EventFlags { blocking, disable_timing, interprocess }.bits()
        };
        assert_eq!(flag(true, false, false), hipEventBlockingSync);
        assert_eq!(flag(false, true, false), hipEventDisableTiming);
        assert_eq!(flag(false, false, true), hipEventInterprocess);
    }
}
