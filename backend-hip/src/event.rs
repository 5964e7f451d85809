//! Events: creation with flags, record, query, synchronisation and elapsed time.

use gpumem_core::{DeviceId, EventFlags, Result};
use hip_sys::hiprt::{
    hipEventBlockingSync, hipEventDefault, hipEventDisableTiming, hipEventInterprocess, hipEvent_t,
};

use crate::device::set_device;
use crate::result::{check, sys, ERROR_NOT_READY};
use crate::stream::HipStream;

/// A HIP event handle (`hipEvent_t`), owned by gpumem's typed `Event` and destroyed through
/// `Backend::event_destroy`.
#[derive(Debug)]
pub struct HipEvent(hipEvent_t);

// SAFETY: the handle is an opaque identifier that gpumem never dereferences; it is only passed
// to HIP runtime functions, which are thread-safe, so the event may move between threads.
unsafe impl Send for HipEvent {}
// SAFETY: shared access only reads the pointer value and passes it to thread-safe HIP calls.
unsafe impl Sync for HipEvent {}

impl HipEvent {
    /// The raw `hipEvent_t`.
    #[must_use]
    pub fn handle(&self) -> hipEvent_t {
        self.0
    }
}

/// Creates an event on `dev`. HIP's flag bits are CUDA's (blocking sync 1, disable timing 2,
/// interprocess 4); they are mapped one by one all the same.
pub(crate) fn event_create(dev: DeviceId, flags: EventFlags) -> Result<HipEvent> {
    set_device(dev)?;
    let mut bits = hipEventDefault;
    if flags.blocking {
        bits |= hipEventBlockingSync;
    }
    if flags.disable_timing {
        bits |= hipEventDisableTiming;
    }
    if flags.interprocess {
        bits |= hipEventInterprocess;
    }
    let mut event: hipEvent_t = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the flags are HIP's.
    check("hipEventCreateWithFlags", unsafe { sys::hipEventCreateWithFlags(&mut event, bits) })?;
    Ok(HipEvent(event))
}

/// Destroys an event.
pub(crate) fn event_destroy(dev: DeviceId, event: HipEvent) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the event came from `event_create` and is consumed here, so destroyed once.
    check("hipEventDestroy", unsafe { sys::hipEventDestroy(event.0) })
}

/// Records the event at the current end of `stream`'s work.
pub(crate) fn event_record(dev: DeviceId, event: &HipEvent, stream: HipStream) -> Result<()> {
    set_device(dev)?;
    // SAFETY: both handles are live (the `Backend` contract).
    check("hipEventRecord", unsafe { sys::hipEventRecord(event.0, stream.handle()) })
}

/// `Ok(true)` when the work before the last record is done; `hipErrorNotReady` is `Ok(false)`.
pub(crate) fn event_query(dev: DeviceId, event: &HipEvent) -> Result<bool> {
    set_device(dev)?;
    // SAFETY: the event is live.
    match unsafe { sys::hipEventQuery(event.0) } {
        ERROR_NOT_READY => Ok(false),
        code => check("hipEventQuery", code).map(|()| true),
    }
}

/// Waits for the work before the last record.
pub(crate) fn event_synchronize(dev: DeviceId, event: &HipEvent) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the event is live.
    check("hipEventSynchronize", unsafe { sys::hipEventSynchronize(event.0) })
}

/// Milliseconds between two completed events.
pub(crate) fn event_elapsed_ms(dev: DeviceId, start: &HipEvent, end: &HipEvent) -> Result<f32> {
    set_device(dev)?;
    let mut ms = 0f32;
    // SAFETY: an out-pointer to a local; both events are live.
    check("hipEventElapsedTime", unsafe { sys::hipEventElapsedTime(&mut ms, start.0, end.0) })?;
    Ok(ms)
}
