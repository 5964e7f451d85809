//! [`Counting`]: a raw allocator that forwards to another and counts what it does: the raw
//! allocations and frees, the bytes held and their peak. The fragmentation replays, the
//! benchmark's device replays and the C ABI's driver-call statistics all count through it.
//!
//! With an expandable inner allocator, a growth counts as a raw allocation and a shrink that gave
//! bytes back as a raw free, as PyTorch counts its expandable segments' maps and unmaps; with
//! stitching, lifting the pages under a free chunk counts as a raw free too. The time
//! spent in the inner allocator's calls (the driver's, on a device) is summed too. Raw calls are
//! the pool's cold path, so the shared atomics and the clock reads cost nothing that matters.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
    /// Bytes of pages lifted out of blocks so far ([`RawAllocator::lift_pages`]).
    pub lifted: AtomicUsize,
    /// Nanoseconds spent in the inner allocator's calls so far (allocations, growths, shrinks and
    /// frees, failed ones included): on a device, the time in the driver.
    pub driver_ns: AtomicU64,
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

    /// Runs `call`, one call of the inner allocator, adding the time it took to `driver_ns`.
    fn timed<T>(&self, call: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = call();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.driver_ns.fetch_add(ns, Ordering::Relaxed);
        out
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
    /// Taken (and dropped) only by `Counted`'s own drop, which times it.
    block: Option<K>,
    counts: Arc<Counts>,
}

impl<K: RawBlock> Counted<K> {
    /// The inner block.
    #[must_use]
    pub fn block(&self) -> &K {
        self.block.as_ref().unwrap_or_else(|| unreachable!("the block is taken only when dropped"))
    }

    fn block_mut(&mut self) -> &mut K {
        self.block.as_mut().unwrap_or_else(|| unreachable!("the block is taken only when dropped"))
    }
}

impl<K: RawBlock> RawBlock for Counted<K> {
    fn address(&self) -> DevicePtr {
        self.block().address()
    }
    fn size(&self) -> usize {
        self.block().size()
    }
    fn device(&self) -> DeviceId {
        self.block().device()
    }
    fn held(&self) -> usize {
        self.block().held()
    }
}

impl<K: RawBlock> Drop for Counted<K> {
    fn drop(&mut self) {
        // What the block holds now: growths, shrinks and lifts were counted as they happened.
        let block = self.block.take();
        self.counts.freed(block.as_ref().map_or(0, RawBlock::held));
        self.counts.timed(|| drop(block));
    }
}

/// `A: Clone` so that [`RawAllocator::for_device`] can make the inner allocator of each device.
impl<A: RawAllocator + Clone> RawAllocator for Counting<A> {
    type Block = Counted<A::Block>;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        let block = self.counts.timed(|| self.inner.allocate(device, size))?;
        self.counts.allocated(block.size());
        Ok(Counted { block: Some(block), counts: Arc::clone(&self.counts) })
    }

    fn expandable(&self) -> bool {
        self.inner.expandable()
    }

    fn granule(&self) -> usize {
        self.inner.granule()
    }

    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        let grown = self.counts.timed(|| self.inner.grow(block.block_mut(), extra))?;
        if grown {
            self.counts.allocated(extra);
        }
        Ok(grown)
    }

    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        let cut = self.counts.timed(|| self.inner.shrink(block.block_mut(), bytes))?;
        if cut > 0 {
            self.counts.freed(cut);
        }
        Ok(cut)
    }

    fn shrinkable(&self, block: &Self::Block, bytes: usize) -> usize {
        self.inner.shrinkable(block.block(), bytes)
    }

    fn stitches(&self) -> bool {
        self.inner.stitches()
    }

    #[allow(unsafe_code)] // forwards the caller's promise
    unsafe fn lift_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        // SAFETY: the caller's promise, passed on: the counted block is the inner one.
        let lifted =
            self.counts.timed(|| unsafe { self.inner.lift_pages(block.block_mut(), offset, len) })?;
        if lifted > 0 {
            self.counts.freed(lifted);
            self.counts.lifted.fetch_add(lifted, Ordering::Relaxed);
        }
        Ok(lifted)
    }

    fn map_pages(&self, block: &mut Self::Block, offset: usize, len: usize) -> Result<usize> {
        let mapped = self.counts.timed(|| self.inner.map_pages(block.block_mut(), offset, len))?;
        if mapped > 0 {
            self.counts.allocated(mapped);
        }
        Ok(mapped)
    }

    fn drop_lifted_pages(&self) {
        self.counts.timed(|| self.inner.drop_lifted_pages());
    }

    fn for_device(&self, device: DeviceId) -> Result<Self> {
        Ok(Counting { inner: self.inner.for_device(device)?, counts: Arc::clone(&self.counts) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A raw allocator whose allocations and frees each take a millisecond.
    #[derive(Clone, Debug, Default)]
    struct Slow;

    #[derive(Debug)]
    struct SlowBlock(usize);

    impl RawBlock for SlowBlock {
        fn address(&self) -> DevicePtr {
            4096
        }
        fn size(&self) -> usize {
            self.0
        }
        fn device(&self) -> DeviceId {
            0
        }
    }

    impl Drop for SlowBlock {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    impl RawAllocator for Slow {
        type Block = SlowBlock;

        fn allocate(&self, _: DeviceId, size: usize) -> Result<SlowBlock> {
            std::thread::sleep(Duration::from_millis(1));
            Ok(SlowBlock(size))
        }
    }

    #[test]
    fn the_time_in_the_inner_allocator_is_summed_frees_included() {
        let counting = Counting::new(Slow);
        let block = counting.allocate(0, 4096).unwrap();
        let after_allocation = counting.counts().driver_ns.load(Ordering::Relaxed);
        assert!(after_allocation >= 1_000_000, "{after_allocation} ns");
        assert_eq!(block.size(), 4096);
        drop(block);
        let after_free = counting.counts().driver_ns.load(Ordering::Relaxed);
        assert!(after_free >= after_allocation + 1_000_000, "{after_free} ns");
        assert_eq!(counting.counts().snapshot(), (1, 1, 0, 4096));
    }
}
