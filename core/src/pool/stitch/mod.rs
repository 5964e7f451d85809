//! Stitching (GMLake's idea, on expandable segments): when a growing block must grow, the whole
//! pages under the arena's free chunks are lifted out of their blocks and mapped where the
//! request goes (the growing block's end, or a range lifted before, with the free chunks beside
//! it), so that a request no hole fits is met by memory the pool already holds rather than by new
//! memory. `free_all_blocks` lifts the pages under every free chunk and gives them back, so a
//! fragmented pool returns nearly all it does not lend.
//!
//! The cost is driver calls, a few per page moved (unmapping it, mapping it again, the access of
//! the growth), and a wait for the work queued on the device before pages are unmapped (the raw
//! allocator's, as for a shrink). Only misses that grow a block pay it; a hit never does.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};

use super::arena::{ArenaState, Lent, Window};
use super::{Pool, RawAllocator};

/// Gives back the pages the raw allocator lifted and no growth mapped again, when dropped at the
/// end of a miss ([`RawAllocator::drop_lifted_pages`]).
pub(super) struct LiftedPages<'a, R: RawAllocator>(pub(super) &'a R);

impl<R: RawAllocator> Drop for LiftedPages<'_, R> {
    fn drop(&mut self) {
        self.0.drop_lifted_pages();
    }
}

impl<R: RawAllocator> Pool<R> {
    /// Whether the pool stitches: expandable segments on an allocator that moves pages.
    pub(super) fn stitching(&self) -> bool {
        self.shared.expandable.load(Ordering::Relaxed) && self.shared.allocator.stitches()
    }

    /// Lifts up to `want` bytes of the pages under arena `st`'s free chunks into the raw
    /// allocator, for a growth to map again; returns the bytes lifted, which the pool no longer
    /// counts as held. The caller gives back what no growth took
    /// ([`RawAllocator::drop_lifted_pages`]) once its lock is released.
    ///
    /// # Errors
    ///
    /// The allocator's first error; what was lifted before it stays lifted, off the pool's
    /// total.
    pub(super) fn lift_for_growth(
        &self,
        st: &mut ArenaState<R::Block>,
        want: usize,
        spare: Option<&Window>,
    ) -> Result<usize> {
        if !self.stitching() || want == 0 {
            return Ok(0);
        }
        let mut failed: Option<Error> = None;
        let lifted = self.lift_with(st, want, spare, &mut failed);
        match failed {
            Some(e) => Err(e),
            None => Ok(lifted),
        }
    }

    /// For `free_all_blocks`: lifts the pages under every free chunk of arena `st` (the
    /// caller gives them back); returns the bytes lifted. An allocator's error stops the lifting
    /// and keeps the rest cached, as a failed shrink does.
    pub(super) fn lift_all(&self, st: &mut ArenaState<R::Block>) -> usize {
        if !self.stitching() {
            return 0;
        }
        self.lift_with(st, usize::MAX, None, &mut None)
    }

    /// Lifts up to `want` bytes, stopping at the first error, which goes to `failed`; takes the
    /// bytes lifted off the pool's total.
    #[allow(unsafe_code)] // lifting pages: the pool keeps the promise, see the SAFETY below
    fn lift_with(
        &self,
        st: &mut ArenaState<R::Block>,
        want: usize,
        spare: Option<&Window>,
        failed: &mut Option<Error>,
    ) -> usize {
        let (allocator, granule) = (&self.shared.allocator, self.shared.allocator.granule().max(1));
        let lifted = st.lift_pages(want, granule, spare, |block, offset, len| {
            if failed.is_some() {
                return 0;
            }
            // SAFETY: the arena lifts only whole pages under a free chunk, which nothing uses: the
            // pool lends none of it (a lifted range is never lent until mapped again), and the
            // blocks are the pool's alone (a runtime's allocator first waits for the work queued
            // on the device, as `RawAllocator::WAITS_FOR_QUEUED_WORK` says of a shrink).
            unsafe { allocator.lift_pages(block, offset, len) }.unwrap_or_else(|e| {
                *failed = Some(e);
                0
            })
        });
        self.shared.total_bytes.fetch_sub(lifted, Ordering::Relaxed);
        lifted
    }

    /// Stitching on a miss that would grow a block by `growth` bytes (what its tail lacks, before
    /// the growth policy's step): when a block's lifted range and the free chunks beside it hold
    /// a request of `mem_size` bytes (`size` asked for) for no more bytes mapped than the growth, maps those bytes (pages lifted from other
    /// free chunks first) and lends the request there. The free chunks beside the lifted range,
    /// too small for any request alone, are used rather than held. `None` when no such place
    /// is cheaper, or its bytes would pass the limit.
    ///
    /// # Errors
    ///
    /// The allocator's error lifting or mapping; what was mapped before it stays free and
    /// counted.
    pub(super) fn lend_from_lifted(
        &self,
        st: &mut ArenaState<R::Block>,
        size: usize,
        mem_size: usize,
        growth: usize,
    ) -> Result<Option<Lent>> {
        let granule = self.shared.allocator.granule().max(1);
        let Some(window) = st.lifted_window(mem_size, granule).filter(|w| w.cost <= growth) else {
            return Ok(None);
        };
        self.lift_for_growth(st, window.cost, Some(&window))?;
        let limit = self.get_limit();
        let fits = self.shared.total_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
            total.checked_add(window.cost).filter(|&t| limit == 0 || t <= limit)
        });
        if fits.is_err() {
            return Ok(None);
        }
        let allocator = &self.shared.allocator;
        let mut failed: Option<Error> = None;
        let (mapped, lent) = st.lend_from_window(window, mem_size, size, |block, offset, len| {
            allocator.map_pages(block, offset, len).unwrap_or_else(|e| {
                failed = Some(e);
                0
            })
        });
        self.shared.total_bytes.fetch_sub(window.cost - mapped, Ordering::Relaxed);
        self.raise_peak_total();
        match (failed, lent) {
            (Some(e), None) => Err(e),
            (_, lent) => Ok(lent),
        }
    }
}

#[cfg(test)]
mod tests;
