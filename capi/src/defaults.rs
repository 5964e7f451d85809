//! What a program gets from the ABI when it sets nothing: the policy that holds the least.
//!
//! The ABI serves PyTorch and CuPy programs, whose users compare gpumem with PyTorch's own
//! allocator, so its default must never hold more than PyTorch's default does. CuPy's rule (a
//! block per request size, cached until out of memory) does not meet that: GPT-2 `generate()` over
//! varied batch and prompt lengths held 13.27 GB for 1.60 GB in use through the ABI (PyTorch's
//! default 2.45 GB). `GrowthPolicy::Segments` with expandable segments held 1.67 GB there, and no
//! more than PyTorch's `expandable_segments:True` on the training loops measured beside it, so
//! that is the ABI's default:
//!
//! - every device's pool follows `GrowthPolicy::Segments` (`gpumem_set_growth_policy` changes it);
//! - blocks grow in place (expandable segments) where the backend has virtual memory and the
//!   device offers it (one granule is mapped and given back to find out: a HIP runtime may
//!   export the entry points and answer `hipErrorNotSupported`), unless
//!   `GPUMEM_EXPANDABLE_SEGMENTS=0` asks for fixed blocks; `GPUMEM_EXPANDABLE_SEGMENTS=1` where
//!   virtual memory is not offered is an error, as for the Rust pools;
//! - `GPUMEM_STITCH=1` adds stitching: a growth first takes the pages under free chunks (each
//!   lift waits for the device to be idle, as a shrink does here).
//!
//! The Rust `MemoryPool::new()` keeps CuPy's rule, for parity with CuPy.
//!
//! Memory goes back to the device only once the device is idle. A program frees through the ABI
//! as soon as it has queued its last use (PyTorch's and CuPy's allocators are stream-ordered), so
//! a free chunk of the pool may still be under queued work. Reusing it on its own stream is safe
//! (the work runs in order), giving its pages back to the driver is not: `cuMemFree` waits for the
//! device, but unmapping a growing block does not, and work queued on unmapped pages faults
//! (measured on an H100: every PyTorch program under `hold_peak_in_use`, which releases on misses,
//! failed with an illegal address). So [`AbiAllocator`] synchronises the block's device before
//! each raw free and each shrink, as PyTorch does before it unmaps expandable segments. A
//! synchronisation that fails (a capture underway on the device, a failed context) keeps the
//! memory: a shrink is refused and the block stays cached; a block being dropped is leaked, not
//! freed, and counted in `gpumem_stats`'s `n_failed_other`.

use std::mem::ManuallyDrop;

use gpumem::core::hal::DeviceOps;
use gpumem::core::pool::{expandable_segments_from_env, stitch_from_env, RawAllocator, RawBlock};
use gpumem::{BaseMemory, DefaultBackend, DeviceAllocator, DeviceId, DevicePtr, Error, GrowthPolicy, Result};

use crate::registry::FAILED;

/// The growth policy of every device's pool of the ABI.
pub(crate) const GROWTH_POLICY: GrowthPolicy = GrowthPolicy::Segments;

/// The runtime's device allocator with the ABI's default for growing blocks: growing unless
/// `GPUMEM_EXPANDABLE_SEGMENTS=0` or the backend has no virtual memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct AbiAllocator(DeviceAllocator);

/// The runtime's raw block.
type DeviceBlock = <DeviceAllocator as RawAllocator>::Block;

/// A raw block of [`AbiAllocator`]: the runtime's, given back to the device only once the device
/// has finished its queued work (see the module docs).
#[derive(Debug)]
pub(crate) struct AbiBlock(ManuallyDrop<DeviceBlock>);

impl RawBlock for AbiBlock {
    fn address(&self) -> DevicePtr {
        RawBlock::address(&*self.0)
    }
    fn size(&self) -> usize {
        RawBlock::size(&*self.0)
    }
    fn device(&self) -> DeviceId {
        RawBlock::device(&*self.0)
    }
    fn held(&self) -> usize {
        RawBlock::held(&*self.0)
    }
}

// SAFETY: forwards to the runtime's block, which promises the same; the wrapper only delays its
// drop until the device is idle (or forever).
unsafe impl BaseMemory<DefaultBackend> for AbiBlock {
    fn ptr(&self) -> DevicePtr {
        BaseMemory::<DefaultBackend>::ptr(&*self.0)
    }
    fn size(&self) -> usize {
        BaseMemory::<DefaultBackend>::size(&*self.0)
    }
    fn device_id(&self) -> DeviceId {
        BaseMemory::<DefaultBackend>::device_id(&*self.0)
    }
    fn identity(&self) -> &'static str {
        BaseMemory::<DefaultBackend>::identity(&*self.0)
    }
}

impl Drop for AbiBlock {
    fn drop(&mut self) {
        if DefaultBackend::device_synchronize(RawBlock::device(&*self.0)).is_ok() {
            // SAFETY: dropped once, here; `self.0` is not used again.
            unsafe { ManuallyDrop::drop(&mut self.0) };
        } else {
            // Queued work may still use the block: it is kept (never freed) rather than given
            // back under that work. No error can be returned from a drop: it is counted.
            FAILED.count("raw free");
        }
    }
}

impl RawAllocator for AbiAllocator {
    type Block = AbiBlock;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        self.0.allocate(device, size).map(|b| AbiBlock(ManuallyDrop::new(b)))
    }
    fn expandable(&self) -> bool {
        self.0.expandable()
    }
    fn granule(&self) -> usize {
        self.0.granule()
    }
    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        self.0.grow(&mut block.0, extra)
    }
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        // A failed synchronisation refuses the shrink: the tail stays mapped and cached.
        DefaultBackend::device_synchronize(RawBlock::device(&*block.0))?;
        self.0.shrink(&mut block.0, bytes)
    }
    fn shrinkable(&self, block: &Self::Block, bytes: usize) -> usize {
        self.0.shrinkable(&block.0, bytes)
    }
    fn stitches(&self) -> bool {
        self.0.stitches()
    }
    #[allow(unsafe_code)] // forwards the caller's promise, after the synchronisation a lift needs
    unsafe fn lift_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        // As for a shrink: pages under work still queued are not unmapped; a failed
        // synchronisation refuses the lift, and the pages stay mapped and cached.
        DefaultBackend::device_synchronize(RawBlock::device(&*block.0))?;
        // SAFETY: the caller's promise; the device is idle.
        unsafe { self.0.lift_pages(&mut block.0, offset, len) }
    }
    fn map_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        self.0.map_pages(&mut block.0, offset, len)
    }
    fn drop_lifted_pages(&self) {
        self.0.drop_lifted_pages();
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        let asked = expandable_segments_from_env()?;
        let allocator = if stitch_from_env()? == Some(true) {
            DeviceAllocator::stitching(device)?
        } else if asked == Some(true) {
            DeviceAllocator::expandable(device)?
        } else if asked.is_none() && <DefaultBackend as gpumem::core::hal::Api>::CAPS.virtual_memory {
            growing_if_offered(device)?
        } else {
            DeviceAllocator::fixed()
        };
        Ok(AbiAllocator(allocator))
    }
}

/// Growing blocks on `device` when its runtime offers virtual memory, else fixed blocks: the
/// default where nobody asked. A backend may have the entry points and a device or runtime
/// version may still refuse them (HIP answers `hipErrorNotSupported`, read as `Unsupported`), so
/// one granule is reserved, created, mapped and given back first; an `Unsupported` answer from
/// any of those calls falls back to fixed blocks. Any other error is the caller's.
fn growing_if_offered(device: DeviceId) -> Result<DeviceAllocator> {
    fixed_if_unsupported(DeviceAllocator::expandable(device).and_then(|growing| {
        let block = growing.allocate(device, growing.granule())?;
        drop(block);
        Ok(growing)
    }))
}

/// The probed allocator, or fixed blocks where the probe answered `Unsupported`.
fn fixed_if_unsupported(probe: Result<DeviceAllocator>) -> Result<DeviceAllocator> {
    match probe {
        Ok(growing) => Ok(growing),
        Err(Error::Unsupported { .. }) => Ok(DeviceAllocator::fixed()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_probe_falls_back_to_fixed_blocks_and_other_errors_stay() {
        let unsupported = Err(Error::Unsupported { operation: "virtual memory", backend: "hip" });
        let fallback = fixed_if_unsupported(unsupported).expect("fixed blocks");
        assert!(!fallback.expandable());

        let failed = Err(Error::OutOfMemory { size: 2 << 20, total: None });
        assert!(matches!(fixed_if_unsupported(failed), Err(Error::OutOfMemory { .. })));
    }

    /// On the host backend, which offers virtual memory on every machine (a GPU backend's probe
    /// runs in the conformance and ABI runs on the device).
    #[cfg(not(any(feature = "cuda", feature = "hip")))]
    #[test]
    fn where_the_device_offers_virtual_memory_the_default_grows() {
        let growing = growing_if_offered(0).expect("the probe");
        assert!(growing.expandable());
    }
}
