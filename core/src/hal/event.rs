//! Events: creation, recording, queries and timing.

use crate::error::Result;
use crate::hal::types::{DeviceId, EventFlags};
use crate::hal::Api;

/// Event operations. See the [contract](crate::hal).
pub trait EventOps: Api {
    /// Creates an event on `dev`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<Self::Event>;
    /// Destroys an event.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_destroy(dev: DeviceId, event: Self::Event) -> Result<()>;
    /// Records the event at the current end of `stream`'s work.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn event_record(dev: DeviceId, event: &Self::Event, stream: Self::Stream) -> Result<()>;
    /// `Ok(true)` when the work before the last `record` is done (or the event was never
    /// recorded), `Ok(false)` while it is not.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_query(dev: DeviceId, event: &Self::Event) -> Result<bool>;
    /// Waits for the work before the last `record`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_synchronize(dev: DeviceId, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two completed, timing-enabled events.
    ///
    /// # Errors
    ///
    /// The runtime's error (an event not yet complete, or with timing disabled).
    fn event_elapsed_ms(dev: DeviceId, start: &Self::Event, end: &Self::Event) -> Result<f32>;
}
