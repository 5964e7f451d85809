//! What a pool carves up: raw blocks from a raw allocator.
//!
//! The pool is generic over the allocator and its block type, so a block is stored as itself
//! (no box per block) and freed by dropping it. The pool knows a block only by its address, size
//! and device; what kind of memory it is, and whether touching it is sound, is the business of
//! the layer that makes pointers from the pool's chunks (the runtime requires its blocks to be
//! [`BaseMemory`](crate::BaseMemory) of its backend). The pool still checks every block against
//! the request before lending any of it, so an allocator that returns too little memory, a null
//! block or memory of another device is an error, never a chunk lent over memory that is not
//! there.

use crate::error::{Error, Result};
use crate::hal::types::{DeviceId, DevicePtr};

/// A raw block of memory, freed when dropped.
pub trait RawBlock: Send + Sync + 'static {
    /// The block's first address.
    fn address(&self) -> DevicePtr;
    /// The block's size in bytes.
    fn size(&self) -> usize;
    /// The device the block is on.
    fn device(&self) -> DeviceId;
    /// The bytes of the block backed by memory: its size, less what
    /// [`RawAllocator::lift_pages`] took out of it.
    fn held(&self) -> usize {
        self.size()
    }
}

/// Allocates the raw blocks a pool carves up. The runtime's default calls the device's
/// allocator; tests supply fault-injecting or counting allocators, and embedders their own.
pub trait RawAllocator: Send + Sync + 'static {
    /// What one allocation returns.
    type Block: RawBlock;

    /// Whether dropping or shrinking one of this allocator's blocks first waits for the work
    /// queued on its device. With it, a chunk may go back to its arena while work queued on the
    /// arena's stream still uses it: the pool lends it again only to that stream's later work
    /// (or across streams behind a [`StreamOrder`](super::StreamOrder)), and the memory itself
    /// outlives the work. The runtime then queues work on a chunk's own stream without keeping
    /// the chunk alive (see [`PooledMemory::reuse_stream`](super::PooledMemory::reuse_stream)).
    const WAITS_FOR_QUEUED_WORK: bool = false;

    /// Allocates `size > 0` bytes on `device`.
    ///
    /// # Errors
    ///
    /// An out-of-memory error ([`Error::is_out_of_memory`]) makes the pool release its cache and
    /// retry; any other error goes to the caller as is.
    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block>;

    /// Whether blocks can grow and shrink in place at their end (expandable segments). When
    /// true, a miss first tries to grow the arena's newest block with [`Self::grow`], and
    /// `free_all_blocks` gives back the free tails of blocks with [`Self::shrink`].
    fn expandable(&self) -> bool {
        false
    }

    /// The step, in bytes, in which [`Self::grow`] and [`Self::shrink`] work (a power of two).
    fn granule(&self) -> usize {
        1
    }

    /// Makes `block` `extra` bytes (a multiple of [`Self::granule`]) longer at its end, in
    /// place: its address stays, its size grows. `Ok(false)` when it cannot (its reserved range
    /// is full); the pool then allocates a new block. The pool checks the block after an
    /// `Ok(true)`: same address and device, exactly `extra` bytes longer, or
    /// [`Error::InvalidRawBlock`] and nothing is lent from the growth.
    ///
    /// # Errors
    ///
    /// An out-of-memory error makes the pool fall back to a new block (and its retry ladder).
    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        let _ = (block, extra);
        Ok(false)
    }

    /// Gives back at most the last `bytes` (a multiple of [`Self::granule`], less than the
    /// block's size) of `block`, which the pool no longer lends, and returns how many it gave back:
    /// whole granules, possibly fewer than asked (an allocator that maps growths whole gives back
    /// only whole growths), 0 when it cannot. The pool goes by the block's size afterwards, not
    /// by the returned count: what the block no longer covers is never lent.
    ///
    /// # Errors
    ///
    /// The allocator's error; the block keeps the size it had before the failed step.
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        let _ = (block, bytes);
        Ok(0)
    }

    /// How many of the last `bytes` of `block` a [`Self::shrink`] would give back now, at most:
    /// 0 when it would give back nothing (an allocator that maps growths whole cannot give back
    /// part of one). The pool asks before it shrinks and skips the shrink at 0, since a shrink on
    /// a device first waits for the work queued there. The default answers `bytes` (it may give
    /// back all of it): an allocator that shrinks only in whole pieces says so here.
    fn shrinkable(&self, block: &Self::Block, bytes: usize) -> usize {
        let _ = block;
        bytes
    }

    /// Whether [`Self::lift_pages`] moves pages (stitching): then a growing block's growth first
    /// takes the whole pages under the arena's free chunks, and maps them at the block's end in
    /// place of new memory. Only allocators whose blocks are [`Self::expandable`].
    fn stitches(&self) -> bool {
        false
    }

    /// Unmaps the pages of `block` at `offset..offset + len` (whole granules, inside the block,
    /// which the pool no longer lends and no work uses) and keeps them for this allocator's
    /// next [`Self::grow`] or [`Self::allocate`], which maps them before it makes new memory.
    /// Returns the bytes lifted: a prefix of the range from `offset`, whole granules, 0 when it
    /// cannot (pages mapped across the range's ends, say). The pool checks the block afterwards:
    /// same address and size, [`RawBlock::held`] exactly that much less; what is lifted is
    /// never lent from this block again until [`Self::map_pages`] maps it.
    ///
    /// # Safety
    ///
    /// Nothing uses the range, or reaches it through the block (its address and size, as
    /// memory the block promises is there), until [`Self::map_pages`] maps it again: a lifted
    /// range has no memory behind it, and touching it is a fault on a device.
    ///
    /// # Errors
    ///
    /// The allocator's error; what it lifted before the failure stays lifted and is counted.
    #[allow(unsafe_code)] // the caller promises what a lifted range needs: see Safety
    unsafe fn lift_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        let _ = (block, offset, len);
        Ok(0)
    }

    /// Maps pages at `offset..offset + len` of `block` (whole granules, all lifted before by
    /// [`Self::lift_pages`]): the pages lifted first, new memory for the rest. Returns the bytes
    /// mapped: all of them, or 0 and nothing mapped. The pool checks the block afterwards: same
    /// address and size, [`RawBlock::held`] exactly that much more.
    ///
    /// # Errors
    ///
    /// The allocator's error; nothing is mapped.
    fn map_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        let _ = (block, offset, len);
        Ok(0)
    }

    /// Gives back to the device the pages [`Self::lift_pages`] took and no growth mapped again.
    /// The pool calls it after every miss that lifted pages.
    fn drop_lifted_pages(&self) {}

    /// The allocator for a pool of `device`, made from this one: a clone, unless the allocator
    /// decides something per device (the runtime's device allocator picks fixed or growing
    /// blocks there from `GPUMEM_EXPANDABLE_SEGMENTS`). A multi-device pool calls it once for
    /// each device's pool.
    ///
    /// # Errors
    ///
    /// The allocator's: a malformed environment variable, a backend without what it asks for.
    fn for_device(&self, _device: DeviceId) -> Result<Self>
    where
        Self: Sized + Clone,
    {
        Ok(self.clone())
    }
}

/// Checks a block the allocator returned for a request of `size` bytes on `device`.
pub(crate) fn check_block<K: RawBlock>(block: &K, device: DeviceId, size: usize) -> Result<()> {
    let (address, got, on) = (block.address(), block.size(), block.device());
    let fits = address != 0 && got >= size && address.checked_add(got).is_some() && on == device;
    if fits {
        Ok(())
    } else {
        Err(Error::InvalidRawBlock { requested: size, device, address, size: got, block_device: on })
    }
}

/// Checks a block the allocator says it grew (or resized) in place: it must still start at
/// `address` on `device` and now be exactly `size` bytes long. A block that moved would leave the
/// chunks already lent from it dangling, and one shorter than the pool believes would get chunks
/// lent past its end, so the pool lends nothing from a block that fails this check.
pub(crate) fn check_resized<K: RawBlock>(
    block: &K,
    address: DevicePtr,
    device: DeviceId,
    size: usize,
) -> Result<()> {
    let (now_at, now_size, on) = (block.address(), block.size(), block.device());
    if now_at == address && now_size == size && on == device && address.checked_add(size).is_some() {
        Ok(())
    } else {
        Err(Error::InvalidRawBlock {
            requested: size,
            device,
            address: now_at,
            size: now_size,
            block_device: on,
        })
    }
}

impl<R: RawAllocator> RawAllocator for std::sync::Arc<R> {
    type Block = R::Block;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        (**self).allocate(device, size)
    }
    fn expandable(&self) -> bool {
        (**self).expandable()
    }
    fn granule(&self) -> usize {
        (**self).granule()
    }
    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        (**self).grow(block, extra)
    }
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        (**self).shrink(block, bytes)
    }
    fn shrinkable(&self, block: &Self::Block, bytes: usize) -> usize {
        (**self).shrinkable(block, bytes)
    }
    fn stitches(&self) -> bool {
        (**self).stitches()
    }
    #[allow(unsafe_code)] // forwards the caller's promise
    unsafe fn lift_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        // SAFETY: the caller's promise, passed on.
        unsafe { (**self).lift_pages(block, offset, len) }
    }
    fn map_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        (**self).map_pages(block, offset, len)
    }
    fn drop_lifted_pages(&self) {
        (**self).drop_lifted_pages();
    }
}
