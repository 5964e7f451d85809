//! A stream's lanes: arenas of one stream, so that threads allocating on it at the same time do
//! not share a lock.
//!
//! Every thread allocates on the null stream unless it picks another, and one arena per stream
//! (CuPy's rule) makes all of them take one lock and write the same cache lines: on the H200's
//! host, four and eight threads allocating on the null stream at once ran at about a tenth of
//! one thread's rate, together. So a thread that keeps waiting for its stream's arena lock
//! ([`LANE_AFTER_WAITS`](super::sync::LANE_AFTER_WAITS) waits within
//! [`CONTENTION_WINDOW`](super::sync::CONTENTION_WINDOW) of the arena's allocations, counted in
//! the cold branch of the lock, so the cache hit pays nothing for it) moves to another of the
//! stream's [`ArenaKey::LANES`] lanes, an arena of its own: its next cache hit goes to the miss
//! path, which moves it (the thread's [`ArenaCache`] gives the lane's arena for the stream's key
//! from then on) and serves it there. Threads that take turns, as a training loop's forward and
//! backward threads do, wait too rarely to move, and keep CuPy's one arena, whose freed memory
//! each reuses at once; a program of one thread never has another arena. A per-thread default
//! stream has no lanes (one thread allocates on it).
//!
//! The lanes serve one stream, so memory moves between them in that stream's order, as within
//! one arena: it needs no event and no fence. A miss that its own lane cannot serve takes over
//! the best-fitting free whole block of the stream's other lanes (the block becomes its lane's,
//! and no raw call is made) before it asks the raw allocator for memory. A free chunk that is part
//! of a block with chunks still lent stays in its lane; only when the raw allocator has no
//! memory for the miss (the device or the limit, after the retries) is such a chunk lent to
//! another lane (it goes back to its own lane when freed), so the lanes together never fail an
//! allocation that one arena would have served from its cache.
//!
//! What a move costs, against CuPy's one arena: each lane that grows makes blocks of its own, so
//! the lanes hold their own free memory; a chunk freed in one lane merges only with its own
//! lane's neighbours; and the statistics list each lane as an arena (their
//! [`stream_key`](ArenaKey::stream_key) is their stream's), so the pool's peaks are the sum of
//! the lanes' (see `stats`). Reports of events and segments name the stream for every lane, and
//! `free_all_blocks` of a stream frees the free blocks of all its lanes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::share::{best_fit_first, take_from};
use super::{Arena, ArenaCache, ArenaKey, ArenaRef, Pool, PooledMemory, RawAllocator};

/// The lane the next thread that moves takes: lanes 1 to `LANES - 1` in turn (lane 0 is where
/// every thread starts).
fn next_lane() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    1 + NEXT.fetch_add(1, Ordering::Relaxed) % (ArenaKey::LANES - 1)
}

impl<R: RawAllocator> Pool<R> {
    /// Moves the calling thread, which keeps waiting for the lock of stream `key`'s arena, to
    /// another lane of that stream: from now on `cache` gives that lane's arena for `key`. A
    /// per-thread default stream has no other lane (its waits are counted afresh).
    #[cold]
    #[inline(never)]
    pub(super) fn move_to_lane(&self, key: ArenaKey, cache: &ArenaCache) {
        cache.reset_contention();
        let lane = key.lane(next_lane());
        if lane == key {
            return;
        }
        let arena = self.arena_in_map(lane);
        cache.put(self.shared.uid, key, arena);
    }

    /// The other lanes of the stream of lane `key`, for a miss of that lane; empty (without a
    /// look at the arenas) while no thread of the pool has moved.
    fn other_lanes(&self, key: ArenaKey) -> Vec<Arc<Arena<R>>> {
        if !self.shared.any_lanes.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let stream = key.stream_key();
        let arenas = self.arenas.lock();
        arenas.values().filter(|a| a.key != key && a.key.stream_key() == stream).cloned().collect()
    }

    /// A miss of lane `lane` of the null stream (the arena `key` names for this thread, in
    /// `cache`) that its own arena could not serve, served by taking over another lane's free
    /// whole block: the smallest that the request may be cut from (the lane made first on a
    /// tie, so that a replay is repeatable). `None` when `lane` is not a lane or no other lane
    /// has one.
    pub(super) fn take_over_from_lanes(
        &self,
        size: usize,
        mem_size: usize,
        lane: ArenaKey,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Option<PooledMemory<R>> {
        let mut candidates: Vec<(usize, u32, u32, Arc<Arena<R>>)> = self
            .other_lanes(lane)
            .into_iter()
            .filter_map(|a| {
                let (slot, found) = {
                    let st = a.state.lock();
                    if st.retired {
                        return None;
                    }
                    st.whole_block_for(mem_size)?
                };
                Some((found, a.uid, slot, a))
            })
            .collect();
        candidates.sort_unstable_by_key(|(found, uid, _, _)| (*found, *uid));
        for (found, _, slot, owner) in candidates {
            // Looked at again under the lock: the lane's own threads may have cut it since.
            let Some(mem) = owner.state.lock().hand_over(slot, found) else { continue };
            // Never two arena locks at once: the block is in hand between them.
            loop {
                let arena = self.arena(key, cache);
                let mut st = arena.state.lock();
                if st.retired {
                    // Emptied and dropped from the pool meanwhile: `arena` gives its successor.
                    continue;
                }
                let lent = st.adopt_block(mem, found, mem_size, size);
                drop(st);
                return Some(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size));
            }
        }
        None
    }

    /// A miss of lane `key` that neither its own arena, another lane's whole block nor the raw
    /// allocator could serve, served from another lane's free chunk, which stays that lane's:
    /// the smallest that fits (the lane made first on a tie). `None` when `key` is not a lane or
    /// no other lane has one.
    pub(super) fn lend_from_lanes(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
    ) -> Option<PooledMemory<R>> {
        for owner in best_fit_first(self.other_lanes(key).into_iter(), mem_size) {
            if let Some(lent) = take_from(&owner, mem_size, size) {
                return Some(PooledMemory::lent(&ArenaRef::new(&owner), lent, mem_size));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::hooks::{Observation, Observed, ProcessObserver};
    use crate::pool::trace::CountingAllocator;
    use crate::pool::{ArenaCache, ArenaKey, Pool};

    const U: usize = crate::pool::UNIT;

    fn lanes() -> (ArenaKey, ArenaKey) {
        (ArenaKey::NULL.lane(1), ArenaKey::NULL.lane(2))
    }

    #[test]
    fn a_lane_that_misses_takes_over_another_lanes_free_block_without_a_raw_call() {
        let pool = Pool::new(0, CountingAllocator::default());
        let (one, two) = lanes();
        let (c1, c2) = (ArenaCache::new(), ArenaCache::new());
        let a = pool.malloc(4 * U, one, &c1).unwrap();
        let ptr = a.ptr();
        drop(a);
        let allocs = pool.allocator().counts().snapshot().0;
        let b = pool.malloc(2 * U, two, &c2).unwrap();
        assert_eq!(b.ptr(), ptr, "the other lane's free block, split");
        assert_eq!(pool.allocator().counts().snapshot().0, allocs, "no raw allocation");
        assert_eq!((pool.used_bytes(), pool.total_bytes()), (2 * U, 4 * U));
        // The block is the second lane's now: freed, the chunk merges back there, and the
        // second lane's next allocations are cache hits.
        drop(b);
        assert_eq!(pool.free_chunks(two), vec![(ptr, 4 * U)]);
        assert!(pool.free_chunks(one).is_empty());
        assert!(pool.try_hit(4 * U, two, &c2).is_some());
        let stats = pool.stats();
        assert_eq!((stats.all.segments.allocated, stats.all.segments.freed), (1, 0), "one raw block in all");
        let reserved = |k| stats.arenas.iter().find(|a| a.arena == k).map(|a| a.stats.reserved_bytes.current);
        assert_eq!((reserved(one), reserved(two)), (Some(0), Some(4 * U as u64)));
    }

    #[test]
    fn a_chunk_of_a_block_in_use_stays_in_its_lane_until_the_memory_runs_out() {
        let pool = Pool::new(0, CountingAllocator::default());
        let (one, two) = lanes();
        let (c1, c2) = (ArenaCache::new(), ArenaCache::new());
        drop(pool.malloc(4 * U, one, &c1).unwrap());
        let head = pool.malloc(U, one, &c1).unwrap();
        let allocs = pool.allocator().counts().snapshot().0;
        let own = pool.malloc(U, two, &c2).unwrap();
        assert_eq!(
            pool.allocator().counts().snapshot().0,
            allocs + 1,
            "the split block stays the first lane's"
        );
        pool.set_limit(5 * U);
        let lent = pool.malloc(2 * U, two, &c2).unwrap();
        assert_eq!(lent.ptr(), head.ptr() + U, "at the limit, the first lane's free chunk");
        assert_eq!(pool.allocator().counts().snapshot().0, allocs + 1);
        drop(lent);
        assert_eq!(pool.free_chunks(one), vec![(head.ptr() + U, 3 * U)], "back in its own lane");
        drop((head, own));
    }

    #[test]
    fn other_streams_do_not_take_a_lanes_chunk_and_a_lane_takes_none_of_theirs() {
        // (The lanes here are the null stream's; another stream's lanes are its own.)
        let pool = Pool::new(0, CountingAllocator::default());
        let (one, _) = lanes();
        let other = ArenaKey::stream(0x5000);
        let cache = ArenaCache::new();
        drop(pool.malloc(U, one, &cache).unwrap());
        drop(pool.malloc(U, other, &cache).unwrap());
        let allocs = pool.allocator().counts().snapshot().0;
        let (a, b) = (pool.malloc(U, other, &cache).unwrap(), pool.malloc(U, other, &cache).unwrap());
        assert_eq!(pool.allocator().counts().snapshot().0, allocs + 1, "the second is a raw allocation");
        let c = pool.malloc(U, ArenaKey::NULL, &cache).unwrap();
        assert_eq!(pool.allocator().counts().snapshot().0, allocs + 1, "lane 0 takes lane 1's chunk");
        let d = pool.malloc(U, ArenaKey::NULL, &cache).unwrap();
        assert_eq!(pool.allocator().counts().snapshot().0, allocs + 2, "and not the other stream's");
        drop((a, b, c, d));
    }

    #[test]
    fn freeing_the_null_streams_blocks_frees_every_lane() {
        let pool = Pool::new(0, CountingAllocator::default());
        let (one, two) = lanes();
        let cache = ArenaCache::new();
        let other = ArenaKey::stream(0x5000);
        let held: Vec<_> =
            [ArenaKey::NULL, one, two, other].map(|k| pool.malloc(U, k, &cache).unwrap()).into();
        drop(held);
        assert_eq!(pool.total_bytes(), 4 * U);
        pool.free_all_blocks(Some(one));
        assert_eq!(pool.total_bytes(), 3 * U, "one lane named: that lane");
        pool.free_all_blocks(Some(ArenaKey::NULL));
        assert_eq!(pool.total_bytes(), U, "the null stream: all its lanes, not the other stream");
        assert!(pool.stats().arenas.iter().all(|a| a.arena == other));
    }

    /// Waits for the lock as the lock reports them: `n` of them, `apart` allocations of the
    /// arena from one another.
    fn waits(cache: &ArenaCache, n: u64, apart: u64) {
        for i in 0..n {
            cache.note_contention(i * apart);
        }
    }

    #[test]
    fn a_thread_that_keeps_waiting_on_the_null_stream_moves_to_a_lane_of_its_own() {
        let pool = Pool::new(0, CountingAllocator::default());
        let cache = ArenaCache::new();
        drop(pool.malloc(U, ArenaKey::NULL, &cache).unwrap());
        waits(&cache, u64::from(super::super::sync::LANE_AFTER_WAITS), 4);
        // The thread moves on its next miss (the lock sends a thread that keeps waiting there);
        // this hit is served where the thread was.
        let a = pool.malloc(U, ArenaKey::NULL, &cache).unwrap();
        let b = pool.malloc(U, ArenaKey::NULL, &cache).unwrap();
        let stats = pool.stats();
        let lanes: Vec<ArenaKey> = stats.arenas.iter().map(|s| s.arena).collect();
        assert_eq!(lanes.len(), 2, "{lanes:?}");
        assert!(lanes.iter().all(|k| k.stream_key() == ArenaKey::NULL));
        let moved = lanes.iter().find(|&&k| k != ArenaKey::NULL).copied().unwrap();
        assert!(moved.lane_number() > 0);
        // The second allocation was the new lane's, and the first lane's one block was lent (to
        // `a`): the new lane made a block of its own.
        assert_eq!(pool.allocator().counts().snapshot().0, 2, "the first lane's block and the new lane's");
        drop((a, b));
        assert_eq!(pool.free_chunks(ArenaKey::NULL).len() + pool.free_chunks(moved).len(), 2);
        // What this thread sees as its stream's free chunks is its lane's.
        assert_eq!(pool.free_chunks_seen_by(ArenaKey::NULL, &cache), pool.free_chunks(moved));
    }

    #[test]
    fn a_hit_that_waits_once_too_often_is_served_from_a_new_lane() {
        let pool = Pool::new(0, CountingAllocator::default());
        let cache = ArenaCache::new();
        drop(pool.malloc(U, ArenaKey::NULL, &cache).unwrap());
        waits(&cache, u64::from(super::super::sync::LANE_AFTER_WAITS) - 1, 1);
        // Another thread holds the arena's lock while this one allocates: the wait that makes the
        // count.
        let arena = std::sync::Arc::clone(pool.arenas.lock().get(&ArenaKey::NULL).unwrap());
        let (locked, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let holder = std::thread::spawn(move || {
            let _guard = arena.state.lock();
            locked.0.send(()).unwrap();
            release.1.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
        });
        locked.1.recv().unwrap();
        release.0.send(()).unwrap();
        let a = pool.malloc(U, ArenaKey::NULL, &cache).unwrap();
        holder.join().unwrap();
        let lanes: Vec<ArenaKey> = pool.stats().arenas.iter().map(|s| s.arena).collect();
        assert_eq!(lanes.len(), 2, "{lanes:?}");
        // Served in the new lane, which took the first lane's free block over.
        assert_eq!(pool.allocator().counts().snapshot().0, 1);
        assert!(pool.free_chunks(ArenaKey::NULL).is_empty());
        drop(a);
        let moved = lanes.into_iter().find(|&k| k != ArenaKey::NULL).unwrap();
        assert_eq!(pool.free_chunks(moved).len(), 1);
    }

    #[test]
    fn waits_spread_out_over_the_arenas_allocations_move_no_thread() {
        let pool = Pool::new(0, CountingAllocator::default());
        let cache = ArenaCache::new();
        drop(pool.malloc(U, ArenaKey::NULL, &cache).unwrap());
        // Many waits, but never more than one per window: two threads taking turns.
        waits(
            &cache,
            10 * u64::from(super::super::sync::LANE_AFTER_WAITS),
            super::super::sync::CONTENTION_WINDOW + 1,
        );
        drop(pool.malloc(U, ArenaKey::NULL, &cache).unwrap());
        assert_eq!(pool.stats().arenas.len(), 1);
    }

    #[test]
    fn any_stream_has_lanes_but_a_per_thread_default_stream() {
        let pool = Pool::new(0, CountingAllocator::default());
        let cache = ArenaCache::new();
        let other = ArenaKey::stream(0x5000);
        drop(pool.malloc(U, other, &cache).unwrap());
        waits(&cache, u64::from(super::super::sync::LANE_AFTER_WAITS), 1);
        // The second misses, and the miss path looks at the waits: the thread moves to another
        // lane of the same stream, which takes over the free block.
        let held = (pool.malloc(U, other, &cache).unwrap(), pool.malloc(U, other, &cache).unwrap());
        let arenas: Vec<ArenaKey> = pool.stats().arenas.iter().map(|a| a.arena).collect();
        assert_eq!(arenas.len(), 2, "{arenas:?}");
        assert!(arenas.iter().all(|k| k.stream_key() == other));
        drop(held);
        assert!(!cache.wants_lane(), "its waits are counted afresh");
        pool.free_all_blocks(Some(other));
        assert_eq!(pool.total_bytes(), 0, "the stream's blocks, in both lanes");

        let mine = ArenaKey::per_thread(7);
        drop(pool.malloc(U, mine, &cache).unwrap());
        waits(&cache, u64::from(super::super::sync::LANE_AFTER_WAITS), 1);
        let held = (pool.malloc(U, mine, &cache).unwrap(), pool.malloc(U, mine, &cache).unwrap());
        assert_eq!(pool.stats().arenas.iter().map(|a| a.arena).collect::<Vec<_>>(), vec![mine]);
        assert!(!cache.wants_lane());
        drop(held);
    }

    /// Threads that move between lanes while others free their chunks and take blocks over: no
    /// two live chunks overlap, and every byte comes back.
    #[test]
    fn threads_moving_between_lanes_lend_disjoint_chunks_and_every_byte_comes_back() {
        use std::collections::BTreeMap;
        use std::sync::{mpsc, Arc, Mutex};
        let (threads, rounds) = if cfg!(miri) { (3, 40) } else { (4, 4000) };
        let pool = Arc::new(Pool::new(0, CountingAllocator::default()));
        let live: Arc<Mutex<BTreeMap<usize, usize>>> = Arc::default();
        let (tx, rx) = mpsc::channel::<crate::pool::PooledMemory<CountingAllocator>>();
        let rx = Arc::new(Mutex::new(rx));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (pool, live, tx, rx) =
                    (Arc::clone(&pool), Arc::clone(&live), tx.clone(), Arc::clone(&rx));
                std::thread::spawn(move || {
                    let cache = ArenaCache::new();
                    let mut held = Vec::new();
                    for i in 0..rounds {
                        if i % 50 == t * 7 {
                            // This thread moves to another lane at its next miss.
                            waits(&cache, u64::from(super::super::sync::LANE_AFTER_WAITS), 1);
                        }
                        let size = U * (1 + (i * 7 + t) % 8);
                        let p = pool.malloc(size, ArenaKey::NULL, &cache).unwrap();
                        {
                            let mut live = live.lock().unwrap();
                            let (start, end) = (p.ptr(), p.ptr() + p.size());
                            if let Some((&s, &n)) = live.range(..end).next_back() {
                                assert!(s + n <= start, "chunk {start:#x} overlaps {s:#x}+{n}");
                            }
                            live.insert(start, p.size());
                        }
                        held.push(p);
                        if held.len() > 6 {
                            let p = held.remove(i % held.len());
                            live.lock().unwrap().remove(&p.ptr());
                            // Half of them freed by another thread.
                            if i % 2 == 0 {
                                tx.send(p).unwrap();
                            } else {
                                drop(p);
                            }
                        }
                        while let Ok(p) = rx.lock().unwrap().try_recv() {
                            drop(p);
                        }
                    }
                    for p in held {
                        live.lock().unwrap().remove(&p.ptr());
                        drop(p);
                    }
                })
            })
            .collect();
        drop(tx);
        for h in handles {
            h.join().unwrap();
        }
        while let Ok(p) = rx.lock().unwrap().try_recv() {
            drop(p);
        }
        assert!(live.lock().unwrap().is_empty());
        assert_eq!(pool.used_bytes(), 0);
        assert!(pool.stats().arenas.len() > 1, "the threads moved");
        pool.free_all_blocks(None);
        assert_eq!(pool.total_bytes(), 0, "every byte came back");
        let (allocs, frees, held, _) = pool.allocator().counts().snapshot();
        assert_eq!((allocs, held), (frees, 0));
    }

    #[test]
    fn reports_name_the_null_stream_for_every_lane() {
        struct Arenas(std::sync::Mutex<Vec<u64>>);
        impl ProcessObserver for Arenas {
            fn observe(&self, o: &Observation) {
                if matches!(o.event, Observed::Malloc(_) | Observed::Free(_)) {
                    self.0.lock().unwrap().push(o.arena);
                }
            }
        }
        let seen = std::sync::Arc::new(Arenas(std::sync::Mutex::new(Vec::new())));
        let guard = crate::hooks::install_process_observer(seen.clone());
        let pool = Pool::new(0, CountingAllocator::default());
        let (one, two) = lanes();
        let cache = ArenaCache::new();
        let (a, b) = (pool.malloc(U, one, &cache).unwrap(), pool.malloc(U, two, &cache).unwrap());
        let (pa, pb) = (a.ptr(), b.ptr());
        drop((a, b));
        drop(guard);
        // Other tests' pools may report meanwhile: this pool's events are the four.
        let arenas = seen.0.lock().unwrap().clone();
        assert!(arenas.len() >= 4);
        assert!(arenas.iter().all(|&k| ArenaKey::from_raw(k).stream_key() == ArenaKey::from_raw(k)));
        let snapshot_pool = Pool::new(0, CountingAllocator::default());
        let _held =
            (snapshot_pool.malloc(U, one, &cache).unwrap(), snapshot_pool.malloc(U, two, &cache).unwrap());
        let segments = snapshot_pool.snapshot().segments;
        assert_eq!(segments.len(), 2);
        assert!(segments.iter().all(|s| s.arena == ArenaKey::NULL), "{segments:?}");
        assert_ne!(pa, pb);
        let stats = snapshot_pool.stats();
        let mut per_arena: Vec<ArenaKey> = stats.arenas.iter().map(|a| a.arena).collect();
        per_arena.sort();
        assert_eq!(per_arena, vec![one, two], "the statistics keep the lanes apart");
    }
}
