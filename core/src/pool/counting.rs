//! [`Counting`]: a raw allocator that forwards to another and counts what it does: the raw
//! allocations and frees, the bytes held and their peak. The fragmentation replays, the
//! benchmark's device replays and the C ABI's driver-call statistics all count through it.
//!
//! With an expandable inner allocator, a growth counts as a raw allocation and a shrink that gave
//! bytes back as a raw free, as PyTorch counts its expandable segments' maps and unmaps. Raw calls
//! are the pool's cold path, so the shared atomics cost nothing that matters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{RawAllocator, RawBlock};
use crate::error::Result;
use crate::hal::types::{DeviceId, DevicePtr};

/// The counters of a [`Counting`] allocator, shared by its clones and its blocks.
#[derive(Debug, Default)]
pub struct Counts {
    /// Bytes held now.
    pub held: AtomicUsize,
    /// The most bytes held at once.
    pub peak: AtomicUsize,
    /// Raw allocations (and growths) so far.
    pub allocs: AtomicUsize,
    /// Raw frees (and shrinks that gave bytes back) so far.
    pub frees: AtomicUsize,
}

impl Counts {
    /// `(allocs, frees, held, peak)`, each read once.
    #[must_use]
    pub fn snapshot(&self) -> (usize, usize, usize, usize) {
        (
            self.allocs.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
            self.held.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }

    fn allocated(&self, bytes: usize) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.allocs.fetch_add(1, Ordering::Relaxed);
    }

    fn freed(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        self.frees.fetch_add(1, Ordering::Relaxed);
    }
}

/// A raw allocator that forwards to `A` and counts its calls into [`Counts`] (see the module).
/// Clones, and the allocators [`RawAllocator::for_device`] makes, share the counters.
#[derive(Clone, Debug, Default)]
pub struct Counting<A> {
    inner: A,
    counts: Arc<Counts>,
}

impl<A> Counting<A> {
    /// Counts `inner`'s calls into new counters.
    #[must_use]
    pub fn new(inner: A) -> Self {
        Counting { inner, counts: Arc::default() }
    }

    /// Counts `inner`'s calls into `counts` (shared with whatever else holds them).
    #[must_use]
    pub fn with_counts(inner: A, counts: Arc<Counts>) -> Self {
        Counting { inner, counts }
    }

    /// The counters.
    #[must_use]
    pub fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    /// The allocator counted.
    #[must_use]
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

/// A block of a [`Counting`] allocator: the inner block, which counts itself freed when dropped.
#[derive(Debug)]
pub struct Counted<K: RawBlock> {
    block: K,
    counts: Arc<Counts>,
}

impl<K: RawBlock> Counted<K> {
    /// The inner block.
    #[must_use]
    pub fn block(&self) -> &K {
        &self.block
    }
}

impl<K: RawBlock> RawBlock for Counted<K> {
    fn address(&self) -> DevicePtr {
        self.block.address()
    }
    fn size(&self) -> usize {
        self.block.size()
    }
    fn device(&self) -> DeviceId {
        self.block.device()
    }
}

impl<K: RawBlock> Drop for Counted<K> {
    fn drop(&mut self) {
        // The block's size now: growths and shrinks were counted as they happened.
        self.counts.freed(self.block.size());
    }
}

/// `A: Clone` so that [`RawAllocator::for_device`] can make the inner allocator of each device.
impl<A: RawAllocator + Clone> RawAllocator for Counting<A> {
    type Block = Counted<A::Block>;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        let block = self.inner.allocate(device, size)?;
        self.counts.allocated(block.size());
        Ok(Counted { block, counts: Arc::clone(&self.counts) })
    }

    fn expandable(&self) -> bool {
        self.inner.expandable()
    }

    fn granule(&self) -> usize {
        self.inner.granule()
    }

    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        let grown = self.inner.grow(&mut block.block, extra)?;
        if grown {
            self.counts.allocated(extra);
        }
        Ok(grown)
    }

    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        let cut = self.inner.shrink(&mut block.block, bytes)?;
        if cut > 0 {
            self.counts.freed(cut);
        }
        Ok(cut)
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        Ok(Counting { inner: self.inner.for_device(device)?, counts: Arc::clone(&self.counts) })
    }
}
