//! Devices and the current device of each thread.

use std::marker::PhantomData;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DeviceProperties, MemInfo};
use crate::runtime::state::{current_device, device_count, ThreadBound};
use crate::runtime::stream::StreamRuntime;

/// A device of backend `B`: CuPy's `cupy.cuda.Device`.
///
/// gpumem keeps its own current device per thread (device 0 on a new thread, as the runtimes
/// do) and passes it to the backend explicitly, so the pool's hot path never asks the driver.
pub struct Device<B: StreamRuntime> {
    id: DeviceId,
    _backend: PhantomData<fn() -> B>,
}

impl<B: StreamRuntime> Clone for Device<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: StreamRuntime> Copy for Device<B> {}

impl<B: StreamRuntime> PartialEq for Device<B> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<B: StreamRuntime> Eq for Device<B> {}

impl<B: StreamRuntime> std::fmt::Debug for Device<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} Device {}>", B::NAME, self.id)
    }
}

impl<B: StreamRuntime> Device<B> {
    /// The device with this ordinal. Checked when it is used.
    #[must_use]
    pub fn new(id: DeviceId) -> Self {
        Device { id, _backend: PhantomData }
    }

    /// The calling thread's current device.
    #[must_use]
    pub fn current() -> Self {
        Self::new(current_device::<B>())
    }

    /// The number of devices.
    ///
    /// # Errors
    ///
    /// `DriverNotFound` when the runtime is missing, `NoDevice` when it has no device.
    pub fn count() -> Result<usize> {
        device_count::<B>()
    }

    /// The ordinal.
    #[must_use]
    pub fn id(&self) -> DeviceId {
        self.id
    }

    fn checked(&self) -> Result<DeviceId> {
        let count = device_count::<B>()?;
        match usize::try_from(self.id) {
            Ok(i) if i < count => Ok(self.id),
            _ => Err(Error::NoSuchDevice { device: self.id, count, backend: B::NAME }),
        }
    }

    /// Makes this device current on the calling thread until another is made current. CuPy's
    /// `Device.use()`.
    ///
    /// # Errors
    ///
    /// `NoSuchDevice` for a device that does not exist; the runtime's error.
    pub fn use_device(&self) -> Result<()> {
        let id = self.checked()?;
        B::set_device(id)?;
        set_current_device::<B>(id);
        Ok(())
    }

    /// Makes this device current until the returned guard is dropped; the guard then restores the
    /// device that was current when it was created (CuPy's `with Device(i):`).
    ///
    /// # Errors
    ///
    /// As [`Device::use_device`].
    pub fn enter(&self) -> Result<DeviceGuard<B>> {
        let previous = current_device::<B>();
        self.use_device()?;
        Ok(DeviceGuard { previous, _not_send: PhantomData })
    }

    /// Waits for all work on the device.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn synchronize(&self) -> Result<()> {
        if crate::runtime::state::in_callback() {
            return Err(Error::NotAllowedInCallback { operation: "Device::synchronize" });
        }
        B::device_synchronize(self.checked()?)?;
        crate::runtime::stream::inflight::collect::<B>();
        crate::runtime::state::check_deferred::<B>()
    }

    /// Free and total memory of the device.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn mem_info(&self) -> Result<MemInfo> {
        B::mem_get_info(self.checked()?)
    }

    /// The device's properties.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn properties(&self) -> Result<DeviceProperties> {
        B::device_properties(self.checked()?)
    }

    /// Whether this device can access `peer`'s memory directly.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn can_access_peer(&self, peer: &Device<B>) -> Result<bool> {
        B::can_access_peer(self.checked()?, peer.checked()?)
    }
}

/// Restores the device that was current when [`Device::enter`] made another current.
#[must_use = "the device stops being current as soon as the guard is dropped"]
pub struct DeviceGuard<B: StreamRuntime> {
    previous: DeviceId,
    _not_send: ThreadBound<B>,
}

impl<B: StreamRuntime> Drop for DeviceGuard<B> {
    fn drop(&mut self) {
        // The previous device was valid when the guard was made; an error cannot be reported
        // from `drop`, and gpumem's own notion of the current device is restored regardless.
        let _ = B::set_device(self.previous);
        set_current_device::<B>(self.previous);
    }
}

fn set_current_device<B: StreamRuntime>(id: DeviceId) {
    let _ = B::thread_state().try_with(|ts| ts.device.set(id));
    let _ = B::stream_thread().try_with(|ts| ts.refresh_arena_key());
}
