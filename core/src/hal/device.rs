//! The devices of a runtime: count, properties, memory, peers.

use crate::error::Result;
use crate::hal::types::{DeviceId, DeviceProperties, DevicePtr, MemInfo};
use crate::hal::Api;

/// Device operations. See the [contract](crate::hal).
pub trait DeviceOps: Api {
    /// Number of devices.
    ///
    /// # Errors
    ///
    /// `DriverNotFound` when the runtime library cannot be loaded, `NoDevice` when it reports
    /// no device (a count of zero is returned as `NoDevice` too).
    fn device_count() -> Result<usize>;
    /// Makes `dev` the runtime's current device for the calling thread.
    ///
    /// # Errors
    ///
    /// The runtime's error for an invalid device.
    fn set_device(dev: DeviceId) -> Result<()>;
    /// The device's properties.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties>;
    /// Free and total memory of the device.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo>;
    /// Waits for all work on the device.
    ///
    /// # Errors
    ///
    /// The runtime's error, including a sticky error from earlier asynchronous work.
    fn device_synchronize(dev: DeviceId) -> Result<()>;
    /// Whether `dev` can access `peer`'s memory directly.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool>;
    /// Enables `dev`'s access to `peer`'s memory. Succeeds when it was already enabled.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()>;
    /// The device a pointer belongs to: `Some(dev)` for device memory, `None` for host memory
    /// (or memory the runtime does not know).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>>;
}
