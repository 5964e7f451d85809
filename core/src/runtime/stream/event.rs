//! Events: markers in a stream's work, for waiting, ordering streams and timing.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, EventFlags};
use crate::runtime::state::current_device;
use crate::runtime::stream::StreamRuntime;
use crate::runtime::stream::{self, Stream};

struct Inner<B: StreamRuntime> {
    raw: Option<B::Event>,
    device: DeviceId,
    flags: EventFlags,
}

impl<B: StreamRuntime> Drop for Inner<B> {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            let device = self.device;
            crate::runtime::state::drop_outside_callbacks::<B>(move || {
                // The event is gone either way; an error is kept for the next synchronize.
                if let Err(e) = B::event_destroy(device, raw) {
                    crate::runtime::state::record_drop_error::<B>(e);
                }
            });
        }
    }
}

/// An event: CuPy's `cupy.cuda.Event`. Cloning gives another handle to the same event; it is
/// destroyed when the last clone is dropped.
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{Event, Stream, get_elapsed_time};
///
/// let s = Stream::<Host>::new()?;
/// let start = s.record(None)?;
/// let p = gpumem_core::alloc::<Host>(1 << 20)?;
/// p.memset_async(1, 1 << 20, Some(&s))?;
/// let end = s.record(None)?;
/// end.synchronize()?;
/// assert!(get_elapsed_time(&start, &end)? >= 0.0);
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct Event<B: StreamRuntime> {
    inner: Arc<Inner<B>>,
}

impl<B: StreamRuntime> Clone for Event<B> {
    fn clone(&self) -> Self {
        Event { inner: Arc::clone(&self.inner) }
    }
}

impl<B: StreamRuntime> fmt::Debug for Event<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").field("device", &self.inner.device).field("flags", &self.inner.flags).finish()
    }
}

impl<B: StreamRuntime> Event<B> {
    /// An event with default flags (timing enabled, spinning wait) on the current device.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn new() -> Result<Self> {
        Self::with_flags(EventFlags::default())
    }

    /// An event with the given flags on the current device (CuPy's `Event(block,
    /// disable_timing, interprocess)`).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` ("Timing must be disabled for interprocess events", CuPy's check) for
    /// an interprocess event with timing; the runtime's error.
    pub fn with_flags(flags: EventFlags) -> Result<Self> {
        Self::with_flags_on(current_device::<B>(), flags)
    }

    pub(crate) fn with_flags_on(device: DeviceId, flags: EventFlags) -> Result<Self> {
        if flags.interprocess && !flags.disable_timing {
            return Err(Error::InvalidArgument("Timing must be disabled for interprocess events".into()));
        }
        let raw = B::event_create(device, flags)?;
        Ok(Event { inner: Arc::new(Inner { raw: Some(raw), device, flags }) })
    }

    pub(crate) fn raw(&self) -> &B::Event {
        // `raw` is `Some` from construction until `drop`.
        self.inner.raw.as_ref().expect("event handle is present until drop")
    }

    /// The flags the event was created with.
    #[must_use]
    pub fn flags(&self) -> EventFlags {
        self.inner.flags
    }

    /// The device the event was created on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.inner.device
    }

    /// Records the event at the current end of `stream`'s work, or of the current stream's for
    /// `None` (CuPy's code uses the current stream; its docstring's "null stream" is wrong).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn record(&self, stream: Option<&Stream<B>>) -> Result<()> {
        let (handle, dev, _) = stream::resolve::<B>(stream);
        if dev != self.inner.device {
            // The runtimes refuse an event of one device recorded on a stream of another.
            return Err(Error::WrongDevice { what: "event", expected: dev, found: self.inner.device });
        }
        // SAFETY: the handle `resolve` gave is live for this call (the stream given, or the
        // thread's current stream, which its state holds).
        unsafe { B::event_record(dev, self.raw(), handle) }
    }

    /// Waits until the work before the last record is done.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn synchronize(&self) -> Result<()> {
        B::event_synchronize(self.inner.device, self.raw())
    }

    /// Whether the work before the last record is done (true for an event never recorded). A
    /// failed query reads as `false`, as in CuPy; [`Event::query`] gives the error.
    #[must_use]
    pub fn done(&self) -> bool {
        self.query().unwrap_or(false)
    }

    /// `Ok(true)` when the work before the last record is done.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn query(&self) -> Result<bool> {
        B::event_query(self.inner.device, self.raw())
    }
}

/// Milliseconds elapsed between two recorded, completed events (CuPy's `get_elapsed_time`).
///
/// # Errors
///
/// `InvalidArgument` when either event has timing disabled; the runtime's error when either is
/// not recorded or not complete.
pub fn get_elapsed_time<B: StreamRuntime>(start: &Event<B>, end: &Event<B>) -> Result<f32> {
    if start.flags().disable_timing || end.flags().disable_timing {
        return Err(Error::InvalidArgument("elapsed time needs two events with timing enabled".into()));
    }
    B::event_elapsed_ms(start.device_id(), start.raw(), end.raw())
}
