//! The runtime's own raw allocator for the pools: a fixed block per allocation (`cuMemAlloc`),
//! or, with expandable segments, blocks that grow in place on the virtual-memory API.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::hal::{DeviceId, DevicePtr};
use crate::pool::expandable::{ExpandableAllocator, Segment, DEFAULT_RESERVE};
use crate::pool::{expandable_segments_from_env, RawAllocator, RawBlock};
use crate::runtime::memory::{BaseMemory, Memory};
use crate::runtime::state::Runtime;

/// The runtime's device allocator. Each raw block is a [`Memory`] (`cuMemAlloc`), or, made with
/// [`DeviceAllocator::expandable`] (or from `GPUMEM_EXPANDABLE_SEGMENTS`), a growing
/// [`Segment`] of reserved address space with physical memory mapped at its start.
///
/// [`DeviceAllocator::new`] follows the environment where a pool asks it for a device's
/// allocator ([`RawAllocator::for_device`]), as [`SingleDeviceMemoryPool::new`](super::SingleDeviceMemoryPool::new)
/// and [`MemoryPool`](super::MemoryPool)'s pool of each device do: growing blocks when
/// `GPUMEM_EXPANDABLE_SEGMENTS` is `1` or `true`, fixed ones otherwise. Passed as it is to
/// [`SingleDeviceMemoryPool::with_allocator`](super::SingleDeviceMemoryPool::with_allocator), it
/// makes fixed blocks.
pub struct DeviceAllocator<B: Runtime> {
    mode: Mode<B>,
}

enum Mode<B: Runtime> {
    /// Decided for each device's pool by `GPUMEM_EXPANDABLE_SEGMENTS` ([`RawAllocator::for_device`]);
    /// used directly, fixed blocks.
    FromEnvironment,
    Fixed,
    Growing(Arc<ExpandableAllocator<B>>),
}

impl<B: Runtime> DeviceAllocator<B> {
    /// The allocator that follows `GPUMEM_EXPANDABLE_SEGMENTS` for each device's pool (see the
    /// [type's docs](Self)).
    #[must_use]
    pub const fn new() -> Self {
        DeviceAllocator { mode: Mode::FromEnvironment }
    }

    /// Fixed blocks, whatever the environment says.
    #[must_use]
    pub const fn fixed() -> Self {
        DeviceAllocator { mode: Mode::Fixed }
    }

    /// Growing blocks on `device`'s virtual memory, each reserving 64 GiB of address space or the
    /// device's memory, whichever is less (nothing is mapped until the pool grows a block).
    ///
    /// # Errors
    ///
    /// `Unsupported` where the backend has no virtual memory; the runtime's error.
    pub fn expandable(device: DeviceId) -> Result<Self> {
        let total = B::device_properties(device)?.total_memory;
        let reserve = DEFAULT_RESERVE.min(total.max(1));
        Ok(DeviceAllocator { mode: Mode::Growing(Arc::new(ExpandableAllocator::new(device, reserve)?)) })
    }
}

impl<B: Runtime> Default for DeviceAllocator<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Runtime> Clone for DeviceAllocator<B> {
    fn clone(&self) -> Self {
        let mode = match &self.mode {
            Mode::FromEnvironment => Mode::FromEnvironment,
            Mode::Fixed => Mode::Fixed,
            Mode::Growing(g) => Mode::Growing(Arc::clone(g)),
        };
        DeviceAllocator { mode }
    }
}

impl<B: Runtime> fmt::Debug for DeviceAllocator<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::FromEnvironment => "from the environment",
            Mode::Fixed => "fixed blocks",
            Mode::Growing(_) => "expandable segments",
        };
        write!(f, "DeviceAllocator<{}>({mode})", B::NAME)
    }
}

/// A raw block of a [`DeviceAllocator`].
#[derive(Debug)]
pub enum DeviceBlock<B: Runtime> {
    /// One device allocation.
    Fixed(Memory<B>),
    /// A growing block of reserved address space.
    Growing(Segment<B>),
}

impl<B: Runtime> RawBlock for DeviceBlock<B> {
    fn address(&self) -> DevicePtr {
        match self {
            DeviceBlock::Fixed(m) => BaseMemory::<B>::ptr(m),
            DeviceBlock::Growing(s) => s.address(),
        }
    }
    fn size(&self) -> usize {
        match self {
            DeviceBlock::Fixed(m) => BaseMemory::<B>::size(m),
            DeviceBlock::Growing(s) => s.size(),
        }
    }
    fn device(&self) -> DeviceId {
        match self {
            DeviceBlock::Fixed(m) => m.device_id(),
            DeviceBlock::Growing(s) => s.device(),
        }
    }
}

// SAFETY: a fixed block forwards to its `Memory`, which promises the same; a growing block's
// `size()` is the bytes mapped at its start, which are device memory of `B`, accessible from its
// device (set when they were mapped) until they are unmapped, which happens only when the pool
// shrinks the block past chunks it no longer lends or drops the block.
unsafe impl<B: Runtime> BaseMemory<B> for DeviceBlock<B> {
    fn ptr(&self) -> DevicePtr {
        self.address()
    }
    fn size(&self) -> usize {
        RawBlock::size(self)
    }
    fn device_id(&self) -> DeviceId {
        self.device()
    }
    fn identity(&self) -> &'static str {
        match self {
            DeviceBlock::Fixed(_) => "Memory",
            DeviceBlock::Growing(_) => "ExpandableSegment",
        }
    }
}

impl<B: Runtime> RawAllocator for DeviceAllocator<B> {
    type Block = DeviceBlock<B>;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<DeviceBlock<B>> {
        match &self.mode {
            Mode::Growing(g) => g.allocate(device, size).map(DeviceBlock::Growing),
            Mode::FromEnvironment | Mode::Fixed => Memory::new_on(device, size).map(DeviceBlock::Fixed),
        }
    }

    fn expandable(&self) -> bool {
        matches!(self.mode, Mode::Growing(_))
    }

    fn granule(&self) -> usize {
        match &self.mode {
            Mode::Growing(g) => g.granule(),
            Mode::FromEnvironment | Mode::Fixed => 1,
        }
    }

    fn grow(&self, block: &mut DeviceBlock<B>, extra: usize) -> Result<bool> {
        match (&self.mode, block) {
            (Mode::Growing(g), DeviceBlock::Growing(s)) => g.grow(s, extra),
            _ => Ok(false),
        }
    }

    fn shrink(&self, block: &mut DeviceBlock<B>, bytes: usize) -> Result<usize> {
        match (&self.mode, block) {
            (Mode::Growing(g), DeviceBlock::Growing(s)) => g.shrink(s, bytes),
            _ => Ok(0),
        }
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        match self.mode {
            Mode::FromEnvironment if expandable_segments_from_env()? == Some(true) => {
                Self::expandable(device)
            }
            _ => Ok(self.clone()),
        }
    }
}
