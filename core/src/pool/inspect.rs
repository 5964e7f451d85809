//! Reading the pool: bytes in use, free and held, statistics, snapshots, and the out-of-memory
//! observers that are given them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::Error;
use crate::hal::types::DevicePtr;

use super::{
    Arena, ArenaCache, ArenaKey, ArenaState, ArenaStats, MemoryStats, Pool, PoolSnapshot, PoolStats,
    RawAllocator,
};

impl<R: RawAllocator> Pool<R> {
    pub(super) fn sum_arenas(&self, f: impl Fn(&ArenaState<R::Block>) -> usize) -> usize {
        let arenas: Vec<Arc<Arena<R>>> = self.arenas.lock().values().cloned().collect();
        arenas.iter().map(|a| f(&a.state.lock())).sum()
    }

    /// Bytes lent out (rounded sizes), chunks waiting for a fence included. Chunks whose fences
    /// have completed are given back first, so that once every stream's work has run nothing
    /// freed is counted (with sharing across streams, every chunk lent across comes back fenced).
    #[must_use]
    pub fn used_bytes(&self) -> usize {
        self.collect_fenced(false);
        self.sum_arenas(|st| st.used_bytes)
    }

    /// Bytes cached and free: `total_bytes() - used_bytes()`, as CuPy 14.1+.
    #[must_use]
    pub fn free_bytes(&self) -> usize {
        self.total_bytes().saturating_sub(self.used_bytes())
    }

    /// Bytes held from the raw allocator.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.shared.total_bytes.load(Ordering::Relaxed)
    }

    /// The number of free chunks in all arenas (split remainders counted separately).
    #[must_use]
    pub fn n_free_blocks(&self) -> usize {
        self.sum_arenas(ArenaState::n_free)
    }

    /// The number of chunks released behind a fence that has not been seen complete yet.
    #[must_use]
    pub fn n_fenced(&self) -> usize {
        self.shared.fenced.lock().len()
    }

    /// The pool's statistics and each arena's (see [`PoolStats`]). Takes each arena's lock in
    /// turn, so under concurrent allocation the arenas are read at slightly different moments.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        // As `used_bytes`: completed fences are settled first.
        self.collect_fenced(false);
        let arenas: Vec<Arc<Arena<R>>> = self.arenas.lock().values().cloned().collect();
        let mut sum = *self.shared.retired.lock();
        let (mut used, mut lent) = (0u64, 0u64);
        let mut per_arena: Vec<ArenaStats> = arenas
            .iter()
            .map(|a| {
                let st = a.state.lock();
                sum.absorb(&st.counters);
                used += st.used_bytes as u64;
                lent += st.n_lent as u64;
                ArenaStats {
                    arena: a.key,
                    stats: MemoryStats::of(&st.counters, st.used_bytes as u64, st.n_lent as u64),
                }
            })
            .collect();
        per_arena.sort_unstable_by_key(|a| a.arena);
        let mut all = MemoryStats::of(&sum, used, lent);
        // Reserved bytes are counted once for the pool, off the hot path: exact.
        let total = self.total_bytes() as u64;
        all.reserved_bytes.peak = (self.shared.peak_total.load(Ordering::Relaxed) as u64).max(total);
        all.oom_errors = self.shared.n_oom.load(Ordering::Relaxed);
        all.retries = self.shared.n_retries.load(Ordering::Relaxed);
        all.lent_across_streams = self.shared.n_lent_across.load(Ordering::Relaxed);
        PoolStats {
            device: self.shared.device,
            all,
            peaks_exact: self.shared.arenas_since_reset.load(Ordering::Relaxed) <= 1,
            arenas: per_arena,
        }
    }

    /// Sets every peak of the pool and its arenas to its current value (PyTorch's
    /// `reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        let map = self.arenas.lock();
        for a in map.values() {
            let mut st = a.state.lock();
            let (used, lent) = (st.used_bytes, st.n_lent);
            st.counters.reset_peaks(used, lent);
        }
        // Retired arenas hold nothing: their part of every current value is 0.
        self.shared.retired.lock().reset_peaks(0, 0);
        self.shared.arenas_since_reset.store(map.len(), Ordering::Relaxed);
        self.shared.peak_total.store(self.total_bytes(), Ordering::Relaxed);
    }

    /// Every segment of every arena with its chunks (PyTorch's `memory_snapshot()`).
    #[must_use]
    pub fn snapshot(&self) -> PoolSnapshot {
        let arenas: Vec<Arc<Arena<R>>> = self.arenas.lock().values().cloned().collect();
        let mut segments = Vec::new();
        for a in &arenas {
            let raw = a.state.lock().segments();
            segments.extend(PoolSnapshot::segments_of(a.key.stream_key(), raw));
        }
        segments.sort_unstable_by_key(|s| s.address);
        PoolSnapshot { device: self.shared.device, segments }
    }

    /// The statistics as a readable table, in the spirit of PyTorch's `memory_summary()`.
    #[must_use]
    pub fn memory_summary(&self) -> String {
        self.stats().to_string()
    }

    /// Adds an observer that the pool calls, with the error and its snapshot, before an
    /// allocation's out-of-memory error (`OutOfMemory` or `LimitExceeded`) returns (PyTorch's
    /// `_attach_out_of_memory_observer`). It runs on the allocating thread, outside the pool's
    /// locks.
    pub fn add_oom_observer(&self, observer: impl Fn(&Error, &PoolSnapshot) + Send + Sync + 'static) {
        self.shared.oom_observers.lock().push(Arc::new(observer));
    }

    /// Removes every out-of-memory observer.
    pub fn clear_oom_observers(&self) {
        self.shared.oom_observers.lock().clear();
    }

    /// The free chunks of arena `key` as `(ptr, size)`, for debugging.
    #[must_use]
    pub fn free_chunks(&self, key: ArenaKey) -> Vec<(DevicePtr, usize)> {
        self.arenas.lock().get(&key).map(|a| a.state.lock().free_chunks()).unwrap_or_default()
    }

    /// The free chunks of the arena that a thread with `cache` allocates from on stream `key`:
    /// the lane it moved to, if it moved (module `lanes`), else arena `key`. For debugging.
    #[must_use]
    pub fn free_chunks_seen_by(&self, key: ArenaKey, cache: &ArenaCache) -> Vec<(DevicePtr, usize)> {
        match cache.get::<Arena<R>>(self.shared.uid, key) {
            Some(arena) => arena.state.lock().free_chunks(),
            None => self.free_chunks(key),
        }
    }
}
