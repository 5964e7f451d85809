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
//! - blocks grow in place (expandable segments) where the backend has virtual memory, unless
//!   `GPUMEM_EXPANDABLE_SEGMENTS=0` asks for fixed blocks; `GPUMEM_EXPANDABLE_SEGMENTS=1` on a
//!   backend without virtual memory is an error, as for the Rust pools.
//!
//! The Rust `MemoryPool::new()` keeps CuPy's rule, for parity with CuPy.

use gpumem::core::pool::{expandable_segments_from_env, RawAllocator};
use gpumem::{DefaultBackend, DeviceAllocator, DeviceId, GrowthPolicy, Result};

/// The growth policy of every device's pool of the ABI.
pub(crate) const GROWTH_POLICY: GrowthPolicy = GrowthPolicy::Segments;

/// The runtime's device allocator with the ABI's default for growing blocks: growing unless
/// `GPUMEM_EXPANDABLE_SEGMENTS=0` or the backend has no virtual memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct AbiAllocator(DeviceAllocator);

impl RawAllocator for AbiAllocator {
    type Block = <DeviceAllocator as RawAllocator>::Block;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        self.0.allocate(device, size)
    }
    fn expandable(&self) -> bool {
        self.0.expandable()
    }
    fn granule(&self) -> usize {
        self.0.granule()
    }
    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        self.0.grow(block, extra)
    }
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        self.0.shrink(block, bytes)
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        let growing = match expandable_segments_from_env()? {
            Some(asked) => asked,
            None => <DefaultBackend as gpumem::core::hal::Api>::CAPS.virtual_memory,
        };
        let allocator = if growing { DeviceAllocator::expandable(device)? } else { DeviceAllocator::fixed() };
        Ok(AbiAllocator(allocator))
    }
}
