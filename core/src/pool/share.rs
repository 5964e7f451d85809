//! Lending one stream's free memory to another stream: the pool's memory across its arenas.
//!
//! CuPy's rule keeps each stream's free memory in that stream's arena, so a pool used from several
//! streams holds at least the sum of each stream's own peak, however well each arena is cut: on
//! the benchmark's random trace over four streams that sum is 1.41 times the pool-wide peak in
//! use. With sharing on, a miss that its own arena cannot serve looks in the other arenas before
//! it asks the raw allocator for memory, and takes a free chunk there; the chunk stays its owner
//! arena's (it goes back there, and merges with its neighbours there).
//!
//! Lending across streams is sound only with the streams ordered, which the pool cannot do: it
//! knows arena keys, not streams. A [`StreamOrder`] does it for the pool:
//! - before the chunk is lent, the borrower's stream is made to wait for everything queued on the
//!   owner's stream so far, which includes every use of the chunk before its free (a kernel of the
//!   program's own included);
//! - when the chunk comes back, it goes to its owner's arena behind a [`Fence`] on the borrower's
//!   stream, so the owner's stream reuses it only after the borrower's work on it has run.
//!
//! Neither step waits on the host: the first is a device-side wait (an event), the second a
//! fence the pool looks at when an arena misses, as for any fenced chunk.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};

use super::{
    give_back, Arena, ArenaCache, ArenaKey, ArenaRef, Fence, GrowthPolicy, OtherStreams, Pool, PooledMemory,
    RawAllocator,
};

/// Orders the streams behind two arenas, so that a [`Pool`] may lend one stream's free chunk to
/// another (see [`Pool::set_share_across_streams`]). The runtime implements it with events.
pub trait StreamOrder: Send + Sync + 'static {
    /// Whether `borrower`'s stream can be ordered after `owner`'s now: both streams are known and
    /// live, and neither captures. Called for each candidate arena on a miss, so it makes no
    /// driver call.
    fn can_order(&self, owner: ArenaKey, borrower: ArenaKey) -> bool;

    /// Makes the work queued on `borrower`'s stream from now on wait for the work queued on
    /// `owner`'s stream so far, and keeps `borrower`'s stream alive for the
    /// [`StreamOrder::fence_after`] that will follow; `false` when it could not (a capture found
    /// only now, a runtime error), and then the chunk is not lent.
    fn order_after(&self, owner: ArenaKey, borrower: ArenaKey) -> bool;

    /// A fence that completes once the work queued on `borrower`'s stream so far has run. Called
    /// once for each chunk lent after an [`StreamOrder::order_after`], when it comes back.
    fn fence_after(&self, borrower: ArenaKey) -> Box<dyn Fence>;

    /// Orders the reuse of a chunk of `owner`'s arena after the work the streams `others`
    /// queued on it so far ([`PooledMemory::note_other_stream`]): `None` when nothing is left to
    /// wait for, else a fence the chunk goes back behind. The default, for orders that never see
    /// such a chunk, is a fence that never completes: the chunk is never lent again, which is
    /// safe.
    fn order_after_uses(&self, owner: ArenaKey, others: OtherStreams) -> Option<Box<dyn Fence>> {
        let _ = (owner, others);
        Some(Box::new(Never))
    }
}

/// A [`StreamOrder`] for memory that no device work touches (trace replays, tests): any two
/// arenas may share, and every fence is complete at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoQueuedWork;

impl StreamOrder for NoQueuedWork {
    fn can_order(&self, _owner: ArenaKey, _borrower: ArenaKey) -> bool {
        true
    }
    fn order_after(&self, _owner: ArenaKey, _borrower: ArenaKey) -> bool {
        true
    }
    fn fence_after(&self, _borrower: ArenaKey) -> Box<dyn Fence> {
        Box::new(Done)
    }
    fn order_after_uses(&self, _owner: ArenaKey, _others: OtherStreams) -> Option<Box<dyn Fence>> {
        None
    }
}

struct Done;

/// A fence that never completes: what it fences is never lent again.
pub(super) struct Never;

impl Fence for Never {
    fn is_complete(&self) -> bool {
        false
    }
    fn wait(&self) {}
}

impl Fence for Done {
    fn is_complete(&self) -> bool {
        true
    }
    fn wait(&self) {}
}

/// Two fences as one: complete when both are.
pub(super) struct Both(pub(super) Box<dyn Fence>, pub(super) Box<dyn Fence>);

impl Fence for Both {
    fn is_complete(&self) -> bool {
        self.0.is_complete() && self.1.is_complete()
    }
    fn wait(&self) {
        self.0.wait();
        self.1.wait();
    }
}

/// The arenas among `arenas` that have a free chunk for `mem_size` bytes, best fit first, as
/// within one arena: the smallest free chunk that fits (the arena made first on a tie, so that a
/// replay is repeatable). Measured on the random trace over four streams: 1.22 held over in use,
/// against 1.22 to 1.31 taking the first arena that has a chunk, depending on the arenas' order.
pub(super) fn best_fit_first<R: RawAllocator>(
    arenas: impl Iterator<Item = Arc<Arena<R>>>,
    mem_size: usize,
) -> Vec<Arc<Arena<R>>> {
    let mut candidates: Vec<(usize, u32, Arc<Arena<R>>)> = arenas
        .filter_map(|a| {
            let found = {
                let mut st = a.state.lock();
                if st.retired {
                    return None;
                }
                st.best_fit_with_tail(mem_size)?
            };
            Some((found, a.uid, a))
        })
        .collect();
    candidates.sort_unstable_by_key(|(found, uid, _)| (*found, *uid));
    candidates.into_iter().map(|(_, _, a)| a).collect()
}

/// A chunk of `mem_size` bytes for a request of `size` from another arena, `owner`, if it still
/// has one (its own threads may have taken it since [`best_fit_first`] looked).
pub(super) fn take_from<R: RawAllocator>(
    owner: &Arena<R>,
    mem_size: usize,
    size: usize,
) -> Option<super::arena::Lent> {
    let mut st = owner.state.lock();
    if st.retired {
        return None;
    }
    st.take_with_tail(mem_size, size)
}

impl<R: RawAllocator> Pool<R> {
    /// Installs how the pool orders two arenas' streams, which lending across streams needs
    /// ([`Pool::set_share_across_streams`]). Installed once; later calls are ignored, so that a
    /// chunk lent through it always comes back through it. The runtime's pools install theirs.
    pub fn set_stream_order(&self, order: Box<dyn StreamOrder>) {
        let _ = self.shared.stream_order.set(order);
    }

    /// Turns lending across streams on or off (off by default, as in CuPy): with it, a miss that
    /// its own arena cannot serve takes a free chunk of another arena, with the streams ordered by
    /// the installed [`StreamOrder`], before it asks the raw allocator for memory. The pool then
    /// holds about its pool-wide peak rather than the sum of its streams' peaks, and calls the raw
    /// allocator less. What it costs: two event operations on a miss served so, a fence on that
    /// chunk's free, and the chunk's statistics count in its owner's arena. Turning it off keeps
    /// lent chunks as they are; they come back behind their fences.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when turning it on with no [`StreamOrder`] installed.
    pub fn set_share_across_streams(&self, on: bool) -> Result<()> {
        if on && self.shared.stream_order.get().is_none() {
            return Err(Error::InvalidArgument(
                "sharing memory across streams needs a StreamOrder (Pool::set_stream_order)".into(),
            ));
        }
        self.shared.share.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the pool lends free memory across streams ([`Pool::set_share_across_streams`]).
    #[must_use]
    pub fn shares_across_streams(&self) -> bool {
        self.shared.share.load(Ordering::Relaxed)
    }

    /// A miss that arena `key` could not serve, served from another arena's free chunk when
    /// sharing is on; `None` when no other arena can order its stream or has a chunk that fits.
    /// The arenas are tried in the order they were made, so that a replay is repeatable.
    pub(super) fn borrow(&self, size: usize, mem_size: usize, key: ArenaKey) -> Option<PooledMemory<R>> {
        if !self.shared.share.load(Ordering::Relaxed) {
            return None;
        }
        let order = self.shared.stream_order.get()?;
        let owners: Vec<Arc<Arena<R>>> =
            self.arenas.lock().values().filter(|a| a.key.stream_key() != key.stream_key()).cloned().collect();
        let candidates = best_fit_first(owners.into_iter().filter(|a| order.can_order(a.key, key)), mem_size);
        for owner in candidates {
            // Looked at again under the lock: the arena's own stream may have taken it since.
            let lent = take_from(&owner, mem_size, size);
            let Some(lent) = lent else { continue };
            let arena = ArenaRef::new(&owner);
            if !order.order_after(owner.key, key) {
                give_back(arena, lent.slot);
                continue;
            }
            return Some(self.lent_across(PooledMemory::lent(&arena, lent, mem_size), key));
        }
        None
    }

    /// With expandable segments, a miss that no arena could serve grows the block of the first
    /// arena made (the home arena) and borrows from it, rather than growing a block of its own:
    /// all the streams' memory then lies in one growing block, whose free tail and holes any
    /// stream can use, and the pool holds about what one stream would (the random trace over
    /// four streams: 1.055 held over in use, as on one stream, against 1.22 with a block per
    /// stream). `None` when sharing or expandable segments are off, this is the home arena, or
    /// the streams cannot be ordered: the miss then grows its own arena.
    ///
    /// # Errors
    ///
    /// As a growth in place.
    pub(super) fn grow_shared(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Result<Option<PooledMemory<R>>> {
        if !self.shared.share.load(Ordering::Relaxed)
            || !self.shared.expandable.load(Ordering::Relaxed)
            || self.growth_policy() == GrowthPolicy::HoldPeakInUse
        {
            return Ok(None);
        }
        let Some(order) = self.shared.stream_order.get() else { return Ok(None) };
        let home = self.arenas.lock().values().min_by_key(|a| a.uid).map(|a| a.key);
        // A lane of the borrower's own stream is no other stream to borrow from (module `lanes`).
        let home = home.filter(|&h| h.stream_key() != key.stream_key() && order.can_order(h, key));
        let Some(home) = home else { return Ok(None) };
        let Some(p) = self.grow_in_place(size, mem_size, home, cache)? else { return Ok(None) };
        if !order.order_after(home, key) {
            // Back to the home arena, grown: the miss grows its own arena instead.
            drop(p);
            return Ok(None);
        }
        Ok(Some(self.lent_across(p, key)))
    }

    /// `p`, of another arena, lent to arena `borrower`'s stream: marked so that it comes back
    /// behind a fence on that stream, and counted.
    fn lent_across(&self, mut p: PooledMemory<R>, borrower: ArenaKey) -> PooledMemory<R> {
        p.mark_borrowed(borrower);
        self.shared.n_lent_across.fetch_add(1, Ordering::Relaxed);
        p
    }
}
