//! Virtual memory: reserve an address range, create physical memory in granules, map it into the
//! range and make it accessible, and the inverses. What expandable segments are built on: a range
//! reserved once can grow by mapping more granules at its end, and shrink by unmapping its tail,
//! without moving what is already in it.
//!
//! Every operation has a default that answers [`Error::Unsupported`], so a backend without the
//! API implements the trait with an empty block and says `virtual_memory: false` in its
//! [`Caps`](crate::hal::Caps). A backend whose `CAPS.virtual_memory` is true implements all of it.

use crate::error::{Error, Result};
use crate::hal::types::{DeviceId, DevicePtr};
use crate::hal::Api;

/// Physical memory made by [`VirtualMemoryOps::vm_create`]: the runtime's handle as an integer
/// (`CUmemGenericAllocationHandle`).
pub type PhysicalHandle = u64;

fn unsupported<B: Api>(operation: &'static str) -> Error {
    Error::Unsupported { operation, backend: B::NAME }
}

/// Virtual-memory operations. Sizes and addresses are multiples of [`Self::vm_granularity`].
pub trait VirtualMemoryOps: Api {
    /// The granule of device `dev`'s physical memory and mappings (CUDA's recommended
    /// granularity, 2 MiB on current GPUs).
    ///
    /// # Errors
    ///
    /// `Unsupported` without the API; the runtime's error.
    fn vm_granularity(dev: DeviceId) -> Result<usize> {
        let _ = dev;
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Reserves `size` bytes of device address space for `dev`, aligned to the granule. Nothing
    /// is mapped: touching the range before [`Self::vm_map`] and [`Self::vm_set_access`] is
    /// a device fault.
    ///
    /// # Errors
    ///
    /// `Unsupported`; `InvalidArgument`-like runtime errors for a size that is 0 or not a
    /// multiple of the granule; `OutOfMemory` when the address space is exhausted.
    fn vm_reserve(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        let _ = (dev, size);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Frees a reserved range.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` is exactly a range from [`Self::vm_reserve`], freed once, with nothing
    /// mapped in it.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn vm_free_range(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        let _ = (dev, ptr, size);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Creates `size` bytes of physical memory on `dev` (a multiple of the granule).
    ///
    /// # Errors
    ///
    /// `Unsupported`; `OutOfMemory`; the runtime's error.
    fn vm_create(dev: DeviceId, size: usize) -> Result<PhysicalHandle> {
        let _ = (dev, size);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Releases physical memory. Memory still mapped stays until it is unmapped.
    ///
    /// # Safety
    ///
    /// `handle` came from [`Self::vm_create`] and is released once.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn vm_release(dev: DeviceId, handle: PhysicalHandle) -> Result<()> {
        let _ = (dev, handle);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Maps all of `handle` (`size` bytes) at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` lies in a range reserved with [`Self::vm_reserve`] and not freed, and
    /// nothing is mapped there; `size` is `handle`'s size.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn vm_map(dev: DeviceId, ptr: DevicePtr, size: usize, handle: PhysicalHandle) -> Result<()> {
        let _ = (dev, ptr, size, handle);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Makes `ptr..ptr + size` readable and writable from each device of `devices` (the owner
    /// and, with peer access on, its peers).
    ///
    /// # Safety
    ///
    /// The range is mapped (by [`Self::vm_map`]) in whole mappings.
    ///
    /// # Errors
    ///
    /// The runtime's error (a device that cannot reach the memory, for one).
    unsafe fn vm_set_access(dev: DeviceId, ptr: DevicePtr, size: usize, devices: &[DeviceId]) -> Result<()> {
        let _ = (dev, ptr, size, devices);
        Err(unsupported::<Self>("virtual memory"))
    }

    /// Unmaps `ptr..ptr + size`, whole mappings; the physical memory stays until released.
    ///
    /// # Safety
    ///
    /// The range is mapped in whole mappings and no pending work uses it.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn vm_unmap(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        let _ = (dev, ptr, size);
        Err(unsupported::<Self>("virtual memory"))
    }
}
