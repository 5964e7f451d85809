//! The runtime's own raw allocator for the pools: a fixed block per allocation (`cuMemAlloc`),
//! or, with expandable segments, blocks that grow in place on the virtual-memory API.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::error::Result;
use crate::hal::{DeviceId, DevicePtr};
use crate::pool::expandable::{ExpandableAllocator, Segment, DEFAULT_RESERVE};
use crate::pool::{expandable_segments_from_env, stitch_from_env, RawAllocator, RawBlock};
use crate::runtime::memory::{BaseMemory, Memory};
use crate::runtime::state::{drop_outside_callbacks, record_drop_error};
use crate::runtime::stream::inflight;
use crate::runtime::stream::StreamRuntime;

/// The runtime's device allocator. Each raw block is a [`Memory`] (`cuMemAlloc`), or, made with
/// [`DeviceAllocator::expandable`] (or from `GPUMEM_EXPANDABLE_SEGMENTS`), a growing
/// [`Segment`] of reserved address space with physical memory mapped at its start.
///
/// [`DeviceAllocator::new`] follows the environment where a pool asks it for a device's
/// allocator ([`RawAllocator::for_device`]), as [`SingleDeviceMemoryPool::new`](crate::SingleDeviceMemoryPool::new)
/// and [`MemoryPool`](crate::MemoryPool)'s pool of each device do: growing blocks when
/// `GPUMEM_EXPANDABLE_SEGMENTS` is `1` or `true`, fixed ones otherwise. Passed as it is to
/// [`SingleDeviceMemoryPool::with_allocator`](crate::SingleDeviceMemoryPool::with_allocator), it
/// makes fixed blocks.
pub struct DeviceAllocator<B: StreamRuntime> {
    mode: Mode<B>,
}

enum Mode<B: StreamRuntime> {
    /// Decided for each device's pool by `GPUMEM_EXPANDABLE_SEGMENTS` ([`RawAllocator::for_device`]);
    /// used directly, fixed blocks.
    FromEnvironment,
    Fixed,
    Growing(Arc<ExpandableAllocator<B>>),
}

impl<B: StreamRuntime> DeviceAllocator<B> {
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
        let reserve = reserve_for::<B>(device)?;
        Ok(DeviceAllocator { mode: Mode::Growing(Arc::new(ExpandableAllocator::new(device, reserve)?)) })
    }

    /// As [`DeviceAllocator::expandable`], with stitching: one physical allocation per page, so
    /// that the pool can move the pages under its free chunks to where a growth needs them
    /// ([`ExpandableAllocator::stitching`]). Moving pages first waits for the work queued on the
    /// device with no event, as a shrink does.
    ///
    /// # Errors
    ///
    /// As [`DeviceAllocator::expandable`].
    pub fn stitching(device: DeviceId) -> Result<Self> {
        let reserve = reserve_for::<B>(device)?;
        Ok(DeviceAllocator {
            mode: Mode::Growing(Arc::new(ExpandableAllocator::stitching(device, reserve)?)),
        })
    }
}

/// The address space each growing block of `device` reserves: [`DEFAULT_RESERVE`] or the device's
/// memory, whichever is less.
fn reserve_for<B: StreamRuntime>(device: DeviceId) -> Result<usize> {
    let total = B::device_properties(device)?.total_memory;
    Ok(DEFAULT_RESERVE.min(total.max(1)))
}

impl<B: StreamRuntime> Default for DeviceAllocator<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: StreamRuntime> Clone for DeviceAllocator<B> {
    fn clone(&self) -> Self {
        let mode = match &self.mode {
            Mode::FromEnvironment => Mode::FromEnvironment,
            Mode::Fixed => Mode::Fixed,
            Mode::Growing(g) => Mode::Growing(Arc::clone(g)),
        };
        DeviceAllocator { mode }
    }
}

impl<B: StreamRuntime> fmt::Debug for DeviceAllocator<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::FromEnvironment => "from the environment",
            Mode::Fixed => "fixed blocks",
            Mode::Growing(_) => "expandable segments",
        };
        write!(f, "DeviceAllocator<{}>({mode})", B::NAME)
    }
}

/// A raw block of a [`DeviceAllocator`]: one device allocation, or a growing block of reserved
/// address space.
///
/// Dropping or shrinking a block first waits for the work queued on its device with no event
/// ([`RawAllocator::WAITS_FOR_QUEUED_WORK`]): work gpumem queues on a chunk's own stream does not
/// keep the chunk alive (the pool's stream-ordered reuse makes that safe), so the block must not
/// go back to the device under it. `cuMemFree` waits for the device on its own; `cuMemUnmap`, the
/// host backend's free and HIP's do not. The wait is on events of the streams that queued such
/// work (not a device-wide wait, which a capture elsewhere forbids), and releases are rare
/// (`free_all_blocks`, the out-of-memory ladder and the releasing policies' misses); PyTorch
/// waits for the device before it unmaps. A block whose wait fails (a lost device) is kept,
/// never freed under work that may still run, and the error is kept for the next `synchronize`.
#[derive(Debug)]
pub struct DeviceBlock<B: StreamRuntime>(ManuallyDrop<Block<B>>);

#[derive(Debug)]
enum Block<B: StreamRuntime> {
    Fixed(Memory<B>),
    Growing(Segment<B>),
}

impl<B: StreamRuntime> RawBlock for DeviceBlock<B> {
    fn address(&self) -> DevicePtr {
        match &*self.0 {
            Block::Fixed(m) => BaseMemory::<B>::ptr(m),
            Block::Growing(s) => s.address(),
        }
    }
    fn size(&self) -> usize {
        match &*self.0 {
            Block::Fixed(m) => BaseMemory::<B>::size(m),
            Block::Growing(s) => s.size(),
        }
    }
    fn device(&self) -> DeviceId {
        match &*self.0 {
            Block::Fixed(m) => m.device_id(),
            Block::Growing(s) => s.device(),
        }
    }
    fn held(&self) -> usize {
        match &*self.0 {
            Block::Fixed(m) => BaseMemory::<B>::size(m),
            Block::Growing(s) => s.held(),
        }
    }
}

impl<B: StreamRuntime> Drop for DeviceBlock<B> {
    fn drop(&mut self) {
        let device = RawBlock::device(self);
        // SAFETY: taken once, here, and `self.0` is not used again.
        let block = unsafe { ManuallyDrop::take(&mut self.0) };
        // A host function cannot wait for its own device: the release runs after it.
        drop_outside_callbacks::<B>(move || match inflight::wait_unrecorded::<B>(device) {
            Ok(()) => drop(block),
            Err(e) => {
                record_drop_error::<B>(e);
                std::mem::forget(block);
            }
        });
    }
}

// SAFETY: a fixed block forwards to its `Memory`, which promises the same; a growing block's
// `size()` is the bytes up to the end of its last mapping, which are device memory of `B`,
// accessible from its device (set when they were mapped) until they are unmapped, which happens
// only when the pool shrinks the block past chunks it no longer lends or drops the block, or
// lifts pages under a free chunk: `lift_pages` is unsafe, and its caller promises that nothing
// reaches the lifted range, through this promise or otherwise, until it is mapped again.
unsafe impl<B: StreamRuntime> BaseMemory<B> for DeviceBlock<B> {
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
        match &*self.0 {
            Block::Fixed(_) => "Memory",
            Block::Growing(_) => "ExpandableSegment",
        }
    }
}

impl<B: StreamRuntime> RawAllocator for DeviceAllocator<B> {
    type Block = DeviceBlock<B>;

    const WAITS_FOR_QUEUED_WORK: bool = true;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<DeviceBlock<B>> {
        let block = match &self.mode {
            Mode::Growing(g) => g.allocate(device, size).map(Block::Growing),
            Mode::FromEnvironment | Mode::Fixed => Memory::new_on(device, size).map(Block::Fixed),
        };
        block.map(|b| DeviceBlock(ManuallyDrop::new(b)))
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
        match (&self.mode, &mut *block.0) {
            (Mode::Growing(g), Block::Growing(s)) => g.grow(s, extra),
            _ => Ok(false),
        }
    }

    fn shrink(&self, block: &mut DeviceBlock<B>, bytes: usize) -> Result<usize> {
        match (&self.mode, &mut *block.0) {
            (Mode::Growing(g), Block::Growing(s)) => {
                // Unmapping does not wait for queued work, which may still use the tail: a failed
                // wait refuses the shrink, and the tail stays mapped and cached. A host function
                // cannot wait for its own device: it shrinks nothing.
                if crate::runtime::state::in_callback() {
                    return Ok(0);
                }
                inflight::wait_unrecorded::<B>(s.device())?;
                g.shrink(s, bytes)
            }
            _ => Ok(0),
        }
    }

    fn shrinkable(&self, block: &DeviceBlock<B>, bytes: usize) -> usize {
        match (&self.mode, &*block.0) {
            (Mode::Growing(g), Block::Growing(s)) => g.shrinkable(s, bytes),
            _ => 0,
        }
    }

    fn stitches(&self) -> bool {
        matches!(&self.mode, Mode::Growing(g) if g.stitches())
    }

    #[allow(unsafe_code)] // forwards the caller's promise, after the wait a lift needs
    unsafe fn lift_pages(&self, block: &mut DeviceBlock<B>, offset: usize, len: usize) -> Result<usize> {
        match (&self.mode, &mut *block.0) {
            (Mode::Growing(g), Block::Growing(s)) => {
                // Unmapping does not wait for queued work, which may still use pages the pool
                // lends its own stream again: as for a shrink, the work queued with no event is
                // waited for first, and a host function, which cannot wait, lifts nothing.
                if crate::runtime::state::in_callback() {
                    return Ok(0);
                }
                inflight::wait_unrecorded::<B>(s.device())?;
                // SAFETY: the caller's promise; the wait above covers the queued work.
                unsafe { g.lift_pages(s, offset, len) }
            }
            _ => Ok(0),
        }
    }

    fn map_pages(&self, block: &mut DeviceBlock<B>, offset: usize, len: usize) -> Result<usize> {
        match (&self.mode, &mut *block.0) {
            (Mode::Growing(g), Block::Growing(s)) => g.map_pages(s, offset, len),
            _ => Ok(0),
        }
    }

    fn drop_lifted_pages(&self) {
        if let Mode::Growing(g) = &self.mode {
            g.drop_lifted_pages();
        }
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        match self.mode {
            Mode::FromEnvironment if stitch_from_env()? == Some(true) => Self::stitching(device),
            Mode::FromEnvironment if expandable_segments_from_env()? == Some(true) => {
                Self::expandable(device)
            }
            _ => Ok(self.clone()),
        }
    }
}
