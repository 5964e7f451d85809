//! [`PooledMemory`], the chunk a pool lends, and the ways it goes back: at once, behind a
//! [`Fence`], to the arena of another stream that borrowed it, or between the free hooks.
//!
//! A chunk holds an uncounted [`ArenaRef`] to its arena (see `sync`), so giving it back takes
//! the arena's lock and nothing else; an orphaned arena (its pool dropped) is ended by its last
//! chunk.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::arena::Lent;
use super::planner::RECORDED;
use super::sync::{self, ArenaRef};
use super::{share, Arena, ArenaKey, ArenaState, Fence, Fenced, RawAllocator, RawBlock};
use crate::error::Result;
use crate::hal::types::{DeviceId, DevicePtr};
use crate::hooks::{self, AllocEvent, Failed, FreeEvent, Observed};

/// A chunk lent by a pool; it goes back to the pool when dropped (CuPy's `PooledMemory`).
pub struct PooledMemory<R: RawAllocator> {
    arena: Option<ArenaRef<Arena<R>>>,
    slot: u32,
    device: DeviceId,
    ptr: DevicePtr,
    size: usize,
    /// For a zero-size allocation (no chunk): the id hooks see. For a chunk lent to another
    /// stream than its arena's (see `share`): the borrower's arena key plus one. For a chunk lent
    /// while the planner records its iteration: `planner::RECORDED` and the chunk's number in the
    /// record. Else 0, which the free path tests, so that a plain chunk pays one comparison for
    /// this.
    ///
    /// For a chunk other streams used with no event ([`PooledMemory::note_other_stream`]):
    /// [`OTHERS`] with the one stream's arena key plus one, or with [`MANY`] for more than one.
    /// Noted through a shared reference, hence atomic; the free path reads it through `&mut`
    /// with no atomic operation, and a plain chunk still pays one comparison.
    tag: AtomicU64,
}

/// The mark of a tag that names the other streams that used a chunk (see `tag`): above every
/// arena key of a stream that can be noted or borrow (owned streams, the null and legacy streams:
/// their keys are addresses or small numbers), and read only without [`RECORDED`] (a recorded
/// chunk's tag uses this bit for its own mark, and such a chunk is never noted).
const OTHERS: u64 = 1 << 61;
/// With [`OTHERS`], more than one other stream.
const MANY: u64 = OTHERS - 1;

/// Whether `tag` names other streams (see `tag`).
const fn names_others(tag: u64) -> bool {
    tag & OTHERS != 0 && tag & RECORDED == 0
}

/// The other streams whose work used a chunk with no event
/// ([`PooledMemory::note_other_stream`]): the chunk's free goes behind a fence on their work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtherStreams {
    /// None: the chunk's own stream's order covers its reuse.
    None,
    /// One stream, by its arena key.
    One(ArenaKey),
    /// More than one: the fence is on every stream of the device that has such work.
    Many,
}

impl<R: RawAllocator> PooledMemory<R> {
    /// The chunk `lent` by `arena`, of `size` (rounded) bytes.
    #[inline]
    pub(super) fn lent(arena: &ArenaRef<Arena<R>>, lent: Lent, size: usize) -> Self {
        PooledMemory {
            arena: Some(arena.clone_ref()),
            slot: lent.slot,
            device: arena.get().shared.device,
            ptr: lent.ptr,
            size,
            tag: AtomicU64::new(0),
        }
    }

    /// Marks the chunk as lent to arena `borrower`'s stream, another than its arena's.
    pub(super) fn mark_borrowed(&mut self, borrower: ArenaKey) {
        *self.tag.get_mut() = borrower.raw().wrapping_add(1);
    }

    /// For a chunk (the caller has its arena): the arena key of the stream it was lent to, when
    /// that is not its arena's stream.
    fn borrower(&self) -> Option<ArenaKey> {
        let tag = self.tag.load(Ordering::Relaxed);
        (tag != 0 && tag & (RECORDED | OTHERS) == 0).then(|| ArenaKey::from_raw(tag.wrapping_sub(1)))
    }

    /// The arena key of the stream whose order makes reusing this chunk safe without waiting:
    /// its arena's stream (lane 0), for a chunk lent to that stream by a pool whose allocator
    /// waits for queued work before it frees ([`RawAllocator::WAITS_FOR_QUEUED_WORK`]). Work
    /// queued on that stream needs nothing to keep the chunk alive: after its free, the pool
    /// lends it again only to that stream's later work (another stream borrows it only after
    /// waiting for this one), and its block is freed only after the device's work. `None` for a
    /// zero-size allocation, a chunk borrowed by another stream, and pools on other allocators.
    #[must_use]
    #[inline]
    pub fn reuse_stream(&self) -> Option<ArenaKey> {
        if !R::WAITS_FOR_QUEUED_WORK {
            return None;
        }
        let arena = self.arena.as_ref()?;
        self.borrower().is_none().then(|| arena.get().key.stream_key())
    }

    /// Notes that work of `stream` (an arena key of a stream of the chunk's device) was queued on
    /// the chunk with nothing to keep it alive: when the chunk goes back, it goes behind a fence
    /// on that work from the pool's [`StreamOrder`](super::StreamOrder)
    /// ([`order_after_uses`](super::StreamOrder::order_after_uses)), so it is lent again only
    /// once that work has run. `false` for a chunk with no [`reuse_stream`](Self::reuse_stream), whose
    /// users keep it alive instead, and for a chunk the planner recorded (its free tells the
    /// planner first; such work keeps it alive as before). The chunk's own stream needs no note.
    pub fn note_other_stream(&self, stream: ArenaKey) -> bool {
        let Some(own) = self.reuse_stream() else { return false };
        let stream = stream.stream_key();
        if stream == own {
            return true;
        }
        // A key too large for the mark's bits is noted as "more than one": waited for with the
        // rest of the device's streams.
        let one = match stream.raw().checked_add(1) {
            Some(one) if one < MANY => OTHERS | one,
            _ => OTHERS | MANY,
        };
        self.tag
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| match now {
                0 => Some(one),
                now if now == one || now == OTHERS | MANY => None,
                now if names_others(now) => Some(OTHERS | MANY),
                // Recorded by the planner: not noted.
                _ => None,
            })
            .map_or_else(names_others, |_| true)
    }

    /// The other streams noted by [`PooledMemory::note_other_stream`].
    #[must_use]
    #[inline]
    pub fn other_streams(&self) -> OtherStreams {
        let tag = self.tag.load(Ordering::Relaxed);
        if !names_others(tag) {
            return OtherStreams::None;
        }
        match tag & !OTHERS {
            MANY => OtherStreams::Many,
            one => OtherStreams::One(ArenaKey::from_raw(one - 1)),
        }
    }

    /// Marks the chunk as recorded by the planner under `tag` (a chunk borrowed from another
    /// stream's arena keeps its mark, and its free goes unrecorded: the planner then leaves that
    /// allocation to the pool).
    pub(super) fn mark_recorded(&mut self, tag: u64) {
        debug_assert!(tag & RECORDED != 0);
        let now = self.tag.get_mut();
        if *now == 0 {
            *now = tag;
        }
    }

    pub(super) fn empty(device: DeviceId) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PooledMemory {
            arena: None,
            slot: 0,
            device,
            ptr: 0,
            size: 0,
            tag: AtomicU64::new(NEXT.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Whether this is a real chunk (not a zero-size allocation).
    #[must_use]
    pub fn is_chunk(&self) -> bool {
        self.arena.is_some()
    }

    /// An identifier unique among the chunks lent at one time (CuPy's `pmem_id`, there the
    /// address of the chunk's object): the hooks report it for `malloc` and the matching `free`.
    #[must_use]
    pub fn pmem_id(&self) -> u64 {
        match &self.arena {
            Some(arena) => pmem_id_of(arena.get(), self.slot),
            None => self.tag.load(Ordering::Relaxed),
        }
    }

    /// The [`Pool::uid`](super::Pool::uid) of the pool that lent the chunk (`None` for a zero-size allocation).
    #[must_use]
    pub fn pool_uid(&self) -> Option<usize> {
        self.arena.as_ref().map(|arena| Arc::as_ptr(&arena.get().shared).addr())
    }

    /// The chunk's address (0 for a zero-size allocation).
    #[must_use]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The chunk's size: the request rounded to the allocation unit.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The chunk's device.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.device
    }

    /// Returns the chunk to the pool now, reporting a free hook's error (dropping does the same
    /// and records nothing). The chunk goes back even when a hook fails.
    ///
    /// # Errors
    ///
    /// The first error a free hook returned.
    pub fn free(mut self) -> Result<()> {
        match self.arena.take() {
            None => Ok(()),
            Some(arena) if *self.tag.get_mut() != 0 => Ok(self.return_borrowed(arena, None)?),
            Some(arena) if !hooks::active() => {
                give_back(arena, self.slot);
                Ok(())
            }
            Some(arena) => Ok(self.free_hooked(arena)?),
        }
    }

    /// Returns the chunk to the pool behind `fence`: the pool lends it again only once the fence
    /// has completed. The free hooks fire now, as for [`PooledMemory::free`].
    ///
    /// # Errors
    ///
    /// The first error a free hook returned (the chunk is released behind the fence anyway).
    pub fn free_after(mut self, fence: Box<dyn Fence>) -> Result<()> {
        match self.arena.take() {
            None => Ok(()),
            Some(arena) if *self.tag.get_mut() != 0 => Ok(self.return_borrowed(arena, Some(fence))?),
            Some(arena) if !hooks::active() => {
                release_fenced(arena, self.slot, fence);
                Ok(())
            }
            Some(arena) => Ok(self.free_hooked_after(arena, fence)?),
        }
    }

    /// Returns a chunk lent to another stream than its arena's, behind a fence on the borrower's
    /// stream (and `fence`, if any), a chunk the planner recorded (telling the planner of the
    /// free first), or a chunk other streams used with no event (behind a fence on their work),
    /// between the free hooks if any is installed.
    ///
    /// # Errors
    ///
    /// The first error a free hook returned; the chunk is released behind its fences either way.
    #[cold]
    #[inline(never)]
    fn return_borrowed(
        &self,
        arena: ArenaRef<Arena<R>>,
        fence: Option<Box<dyn Fence>>,
    ) -> Result<(), Failed> {
        let tag = self.tag.load(Ordering::Relaxed);
        if tag & RECORDED != 0 {
            arena.get().shared.planner.on_free(tag, self.size);
        }
        let order = arena.get().shared.stream_order.get();
        let own = match (self.borrower(), order) {
            (Some(borrower), Some(order)) => Some(order.fence_after(borrower)),
            // Not reached: a chunk is borrowed only through the installed order, which stays.
            _ => None,
        };
        let uses = match (self.other_streams(), order) {
            (OtherStreams::None, _) => None,
            (others, Some(order)) => order.order_after_uses(arena.get().key.stream_key(), others),
            // Not reached: only a pool's runtime notes other streams, and it installs an order.
            // A fence that never completes keeps the chunk out of use, which is safe.
            (_, None) => Some(Box::new(share::Never) as Box<dyn Fence>),
        };
        let both = |a: Option<Box<dyn Fence>>, b: Option<Box<dyn Fence>>| match (a, b) {
            (Some(a), Some(b)) => Some(Box::new(share::Both(a, b)) as Box<dyn Fence>),
            (a, b) => a.or(b),
        };
        let fence = both(both(own, uses), fence);
        // A fence already complete (the borrower's stream was idle) needs no parking.
        let fence = fence.filter(|f| !f.is_complete());
        match (fence, hooks::active()) {
            (None, false) => give_back(arena, self.slot),
            (Some(fence), false) => release_fenced(arena, self.slot, fence),
            // Through the hooked frees' own functions, which keep their hook dispatch inlined.
            (None, true) => return self.free_hooked(arena),
            (Some(fence), true) => return self.free_hooked_after(arena, fence),
        }
        Ok(())
    }

    /// Returns the chunk now between the free hooks (see [`PooledMemory::free_hooked_behind`]).
    ///
    /// # Errors
    ///
    /// The first error a free hook returned; the chunk is back in the pool either way.
    #[cold]
    #[inline(never)]
    fn free_hooked(&self, arena: ArenaRef<Arena<R>>) -> Result<(), Failed> {
        self.free_hooked_behind(arena, None)
    }

    /// [`PooledMemory::free_hooked`] behind a fence.
    ///
    /// # Errors
    ///
    /// The first error a free hook returned; the chunk is released behind the fence either way.
    #[cold]
    #[inline(never)]
    fn free_hooked_after(&self, arena: ArenaRef<Arena<R>>, fence: Box<dyn Fence>) -> Result<(), Failed> {
        self.free_hooked_behind(arena, Some(fence))
    }

    /// Returns the chunk between the free hooks, behind `fence` if any. Without a free pre-hook
    /// on the thread (the common case: DebugPrintHook and recorders implement only the post
    /// callbacks) the chunk goes back at once, with no guard to build and drop. Inlined into
    /// its two callers, so that the one without a fence has no fence to test.
    ///
    /// # Errors
    ///
    /// The first error a free hook returned; the chunk is back in the pool either way.
    #[inline(always)]
    fn free_hooked_behind(
        &self,
        arena: ArenaRef<Arena<R>>,
        fence: Option<Box<dyn Fence>>,
    ) -> Result<(), Failed> {
        let a = arena.get();
        let event = FreeEvent {
            device_id: self.device,
            mem_size: self.size,
            mem_ptr: self.ptr,
            pmem_id: pmem_id_of(a, self.slot),
        };
        let key = a.key;
        let pre = if hooks::wants(hooks::FREE_PREPROCESS) {
            // The guard returns the chunk even if a pre-hook fails or panics.
            let guard = GiveBackOnDrop(Some((arena, self.slot, fence)));
            let pre = hooks::fire_hooks(hooks::FREE_PREPROCESS, |h| h.free_preprocess(&event));
            drop(guard);
            pre
        } else {
            match fence {
                None => give_back(arena, self.slot),
                Some(fence) => release_fenced(arena, self.slot, fence),
            }
            Ok(())
        };
        hooks::observe_with(|| (Observed::Free(event), key.stream_key().raw()));
        let post = hooks::fire(hooks::FREE_POSTPROCESS, |h| h.free_postprocess(&event));
        pre.and(post)
    }
}

/// Arena and slot identify a lent chunk among those lent at one time; the pool's number keeps
/// two pools' chunks apart. Never 0 (arena numbers start at 1), which hooks read as "failed".
fn pmem_id_of<R: RawAllocator>(arena: &Arena<R>, slot: u32) -> u64 {
    arena.pmem_base | u64::from(slot)
}

/// The bits of a `pmem_id` that arena `arena_uid` of pool `pool_uid` gives all its chunks:
/// `(arena_uid << 32 | slot) ^ (pool_uid << 52)` is this with the slot in the low 32 bits, which
/// the pool's bits never reach.
pub(super) fn pmem_base(arena_uid: u32, pool_uid: u64) -> u64 {
    (u64::from(arena_uid) << 32) ^ (pool_uid << 52)
}

/// A chunk to give back (behind a fence, if any) when dropped.
type Pending<R> = (ArenaRef<Arena<R>>, u32, Option<Box<dyn Fence>>);

struct GiveBackOnDrop<R: RawAllocator>(Option<Pending<R>>);

impl<R: RawAllocator> Drop for GiveBackOnDrop<R> {
    fn drop(&mut self) {
        match self.0.take() {
            Some((arena, slot, None)) => give_back(arena, slot),
            Some((arena, slot, Some(fence))) => release_fenced(arena, slot, fence),
            None => {}
        }
    }
}

/// Parks a chunk behind a fence; it stays lent (and counted as used) until the pool sees the
/// fence complete.
fn release_fenced<R: RawAllocator>(arena: ArenaRef<Arena<R>>, slot: u32, fence: Box<dyn Fence>) {
    let orphaned = {
        let mut st = arena.get().state.lock();
        st.mark_fenced(slot);
        st.orphaned
    };
    if orphaned {
        // The pool is gone and nobody would look at the fence again: wait for it here. A fence
        // that cannot complete now (see `collect_fenced`) keeps its chunk, and the arena, for good.
        fence.wait();
        if fence.is_complete() {
            give_back(arena, slot);
        }
        return;
    }
    let shared = Arc::clone(&arena.get().shared);
    let mut fenced = shared.fenced.lock();
    fenced.push(Fenced { arena, slot, fence });
    shared.any_fenced.store(true, Ordering::Release);
}

/// Tells the process-wide observers of raw blocks of arena `key` about to be given back.
pub(super) fn observe_raw_frees<R: RawAllocator>(device_id: DeviceId, key: ArenaKey, blocks: &[R::Block]) {
    if !hooks::observed() {
        return;
    }
    for b in blocks {
        let event = AllocEvent { device_id, mem_size: b.size(), mem_ptr: b.address() };
        hooks::observe(Observed::RawFree(event), key.stream_key().raw());
    }
}

/// Returns a chunk to its arena. Inlined by force: the hooked free called it (18 instructions
/// of the hooked pair in its prologue and epilogue); the unhooked drop inlined it already.
#[inline(always)]
#[allow(unsafe_code)] // ending an orphaned arena; see `ArenaRef`
pub(super) fn give_back<R: RawAllocator>(arena: ArenaRef<Arena<R>>, slot: u32) {
    let a = arena.get();
    let mut st = a.state.lock();
    // Matched, not kept: the common `None` then has no drop glue to call for the block type.
    let last_of_orphan = match st.give_back(slot) {
        None => {
            let last = st.orphaned && st.n_lent == 0;
            drop(st);
            last
        }
        Some((block, size)) => release_returned_block(a, st, block, size),
    };
    if last_of_orphan {
        // SAFETY: the pool's `Drop` called `keep_alive` for this orphaned arena, and this was its
        // last lent chunk, so this is the one matching release; `arena` is not used again.
        unsafe { arena.release_kept() };
    }
}

/// The rest of [`give_back`] when the returned chunk made a whole raw block of an orphaned
/// arena free: the block is freed outside the lock. Returns whether that was the arena's last
/// lent chunk.
#[cold]
fn release_returned_block<R: RawAllocator>(
    a: &Arena<R>,
    st: sync::ArenaGuard<'_, ArenaState<R::Block>>,
    block: R::Block,
    size: usize,
) -> bool {
    // Under the lock: once it is released, another thread may free an orphaned arena.
    a.shared.total_bytes.fetch_sub(size, Ordering::Relaxed);
    let last_of_orphan = st.orphaned && st.n_lent == 0;
    drop(st);
    observe_raw_frees::<R>(a.shared.device, a.key, std::slice::from_ref(&block));
    // The raw free (a driver call) runs outside the lock; the block is owned, not the arena's.
    drop(block);
    last_of_orphan
}

impl<R: RawAllocator> Drop for PooledMemory<R> {
    #[inline]
    fn drop(&mut self) {
        if let Some(arena) = self.arena.take() {
            if *self.tag.get_mut() != 0 {
                if let Err(e) = self.return_borrowed(arena, None) {
                    hooks::record_drop_error(e.into());
                }
            } else if hooks::active() {
                // A hook's error cannot be returned from `drop`; `free()` reports it, and the
                // hooks' own error slot records it (see `hooks::take_drop_error`).
                if let Err(e) = self.free_hooked(arena) {
                    hooks::record_drop_error(e.into());
                }
            } else {
                give_back(arena, self.slot);
            }
        }
    }
}

impl<R: RawAllocator> fmt::Debug for PooledMemory<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<PooledMemory 0x{:x} size={} device={}>", self.ptr, self.size, self.device)
    }
}
