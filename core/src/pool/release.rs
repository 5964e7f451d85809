//! Giving memory back: chunks behind completed fences, whole free blocks and free tails to the raw
//! allocator, and everything when the pool is dropped. The raw frees (driver calls) always run
//! after every lock is released.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::arena::ArenaState;
use super::{give_back, observe_raw_frees, Arena, ArenaKey, ArenaRef, Pool, RawAllocator};

impl<R: RawAllocator> Pool<R> {
    /// Gives back the fenced chunks whose fences have completed; with `wait`, waits for every
    /// fence first.
    pub(super) fn collect_fenced(&self, wait: bool) {
        if !self.shared.any_fenced.load(Ordering::Acquire) {
            return;
        }
        let pending = std::mem::take(&mut *self.shared.fenced.lock());
        let mut kept = Vec::new();
        for f in pending {
            if wait {
                f.fence.wait();
            }
            // Checked after a wait too: a fence that could not be waited for (one still to be
            // recorded, inside a host function) keeps its chunk.
            if f.fence.is_complete() {
                give_back(f.arena, f.slot);
            } else {
                kept.push(f);
            }
        }
        let mut fenced = self.shared.fenced.lock();
        fenced.extend(kept);
        self.shared.any_fenced.store(!fenced.is_empty(), Ordering::Release);
    }

    /// Releases the free chunks that are whole raw blocks, in every arena (`None`) or in arena
    /// `key` (CuPy's `free_all_blocks(stream=None)`). Arenas left with no memory at all are
    /// dropped from the pool.
    pub fn free_all_blocks(&self, key: Option<ArenaKey>) {
        // Chunks whose fences have completed (those lent across streams, for one) are free now:
        // settled first, their blocks go back too rather than at the next miss.
        self.collect_fenced(false);
        let arenas: Vec<(ArenaKey, Arc<Arena<R>>)> = {
            let map = self.arenas.lock();
            match key {
                None => map.iter().map(|(k, a)| (*k, Arc::clone(a))).collect(),
                // Every lane of the stream, for the stream's key.
                Some(k) => map
                    .iter()
                    .filter(|(mk, _)| **mk == k || (k == k.stream_key() && mk.stream_key() == k))
                    .map(|(mk, a)| (*mk, Arc::clone(a)))
                    .collect(),
            }
        };
        let mut released = Vec::new();
        for (key, arena) in arenas {
            let first = released.len();
            let bytes;
            let empty;
            {
                let mut st = arena.state.lock();
                let cut = self.shrink_free_tails(&mut st);
                bytes = st.release_free_blocks(&mut released) + cut;
                // Stitching: the pages under the free chunks left go too (counted off the total
                // as they are lifted).
                self.lift_all(&mut st);
                empty = st.is_empty();
            }
            self.shared.allocator.drop_lifted_pages();
            self.observe_raw_frees(key, &released[first..]);
            self.shared.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if empty {
                let mut map = self.arenas.lock();
                let mut st = arena.state.lock();
                // Re-checked under both locks: a thread may have allocated from it meanwhile.
                if st.is_empty() && map.get(&key).is_some_and(|a| Arc::ptr_eq(a, &arena)) {
                    st.retired = true;
                    map.remove(&key);
                    self.shared.retired.lock().absorb(&st.counters);
                }
            }
        }
        // The raw frees (driver calls) run after every lock is released.
        drop(released);
    }

    /// With expandable segments, gives back the free tails of arena `st`'s growing blocks, as
    /// far as the raw allocator can ([`RawAllocator::shrinkable`]): a tail it would give nothing
    /// of is not asked for, since a shrink on a device first waits for the work queued there.
    /// Returns the bytes given back. A failed unmap keeps the tail: it stays cached and lendable.
    pub(super) fn shrink_free_tails(&self, st: &mut ArenaState<R::Block>) -> usize {
        if !self.shared.expandable.load(Ordering::Relaxed) {
            return 0;
        }
        let allocator = &self.shared.allocator;
        st.shrink_tails(allocator.granule().max(1), |block, bytes| {
            if allocator.shrinkable(block, bytes) == 0 {
                return 0;
            }
            allocator.shrink(block, bytes).unwrap_or(0)
        })
    }

    /// Releases cached whole blocks of any arena, largest first, until at least `bytes` are
    /// released or none is left.
    pub(super) fn release_cached(&self, bytes: usize) {
        let arenas: Vec<Arc<Arena<R>>> = self.arenas.lock().values().cloned().collect();
        let mut candidates: Vec<(usize, u32, usize)> = Vec::new();
        for (i, arena) in arenas.iter().enumerate() {
            let st = arena.state.lock();
            candidates.extend(st.whole_free_blocks().into_iter().map(|(slot, size)| (size, slot, i)));
        }
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = Vec::new();
        let mut done = 0usize;
        for (size, slot, i) in candidates {
            if done >= bytes {
                break;
            }
            if let Some(mem) = arenas[i].state.lock().release_whole(slot, size) {
                self.shared.total_bytes.fetch_sub(size, Ordering::Relaxed);
                self.observe_raw_frees(arenas[i].key, std::slice::from_ref(&mem));
                released.push(mem);
                done = done.saturating_add(size);
            }
        }
        drop(released);
    }

    /// Tells the process-wide observers of raw blocks about to be given back.
    pub(super) fn observe_raw_frees(&self, key: ArenaKey, blocks: &[R::Block]) {
        observe_raw_frees::<R>(self.shared.device, key, blocks);
    }
}

impl<R: RawAllocator> Drop for Pool<R> {
    fn drop(&mut self) {
        // Fenced chunks are waited for: their blocks go back with the pool.
        self.collect_fenced(true);
        self.free_all_blocks(None);
        // Arenas with chunks still lent out outlive the pool: each is orphaned and kept alive
        // until its last chunk comes back; meanwhile every chunk that comes back releases its raw
        // block as soon as the block is whole again.
        for arena in self.arenas.get_mut().values() {
            let mut st = arena.state.lock();
            let mut released = Vec::new();
            let bytes = st.release_free_blocks(&mut released);
            self.shared.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
            observe_raw_frees::<R>(self.shared.device, arena.key, &released);
            if st.n_lent > 0 {
                st.orphaned = true;
                ArenaRef::keep_alive(arena);
            }
            drop(st);
            drop(released);
        }
    }
}
