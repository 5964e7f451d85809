//! The simulated devices: counts, properties, memory figures, peers.

use crate::error::Result;
use crate::hal::{DeviceId, DeviceOps, DeviceProperties, DevicePtr, MemInfo};

use super::memory;
use super::worker::{drain_device, refuse_device_capture};
use super::Host;

impl DeviceOps for Host {
    fn device_count() -> Result<usize> {
        memory::device_count_checked()
    }
    fn set_device(dev: DeviceId) -> Result<()> {
        memory::check_device("cuCtxSetCurrent", dev).map(drop)
    }
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        memory::check_device("cuDeviceGetAttribute", dev)?;
        Ok(DeviceProperties {
            name: format!("gpumem host device {dev}"),
            total_memory: memory::capacity_checked()?,
            compute_capability: (0, 0),
            multiprocessor_count: std::thread::available_parallelism().map_or(1, |n| n.get() as i32),
            memory_pools_supported: true,
            unified_addressing: true,
        })
    }
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        let i = memory::check_device("cuMemGetInfo", dev)?;
        let total = memory::capacity_checked()?;
        Ok(MemInfo { free: total.saturating_sub(memory::used(i)), total })
    }
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        memory::check_device("cuCtxSynchronize", dev)?;
        // As CUDA: a device-wide wait while a stream of the device captures is refused, and
        // invalidates that capture.
        refuse_device_capture(dev, "cuCtxSynchronize")?;
        drain_device(Some(dev));
        Ok(())
    }
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        memory::check_device("cuDeviceCanAccessPeer", dev)?;
        memory::check_device("cuDeviceCanAccessPeer", peer)?;
        Ok(dev != peer)
    }
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        memory::check_device("cuCtxEnablePeerAccess", dev)?;
        memory::check_device("cuCtxEnablePeerAccess", peer).map(drop)
    }
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        Ok(memory::device_of(ptr))
    }
}
