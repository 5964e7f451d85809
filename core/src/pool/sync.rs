//! The two pieces of the pool's hot path that need `unsafe`, kept apart from the pool's logic.
//!
//! - [`ArenaLock`]: the arena's lock. A lock and an unlock of a futex mutex are two atomic
//!   read-modify-writes; this lock takes one to lock and a plain release store to unlock. Arena
//!   critical sections are a few dozen instructions, so waiting threads spin briefly and then
//!   yield. Against `parking_lot::RawMutex` on the same cache hit (`benches/paths.rs`, host,
//!   cachegrind) it executes 11 fewer instructions per allocate + free pair and one atomic
//!   read-modify-write fewer. Contended by more threads than cores, parking_lot's sleeping
//!   waiters do better than these spinning ones (BENCHMARKS.md), so the crate feature
//!   `parking-lot-arena-lock` gives every arena parking_lot's mutex instead, for programs whose
//!   threads share one stream's arena on an oversubscribed machine. The choice is made at build
//!   time so that the hit pays for one lock only; [`ARENA_LOCK`] names the one built.
//! - [`ArenaRef`]: what a lent chunk holds to find its arena again. An `Arc` would cost an atomic
//!   increment per allocation and a decrement per free; instead the arena counts its lent chunks
//!   under its lock and is kept alive while that count is not zero (see [`ArenaRef`]'s
//!   invariant).

#![allow(unsafe_code)]

use std::any::Any;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
// Under `cfg(loom)` the spinning lock's flag is loom's, so that the model checker explores its
// orderings (`loom_tests`).
#[cfg(all(loom, not(feature = "parking-lot-arena-lock")))]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(all(not(loom), not(feature = "parking-lot-arena-lock")))]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[cfg(feature = "parking-lot-arena-lock")]
use parking_lot::lock_api::RawMutex;

use super::ArenaKey;

/// The arena lock this build uses: `"spin"` (the default) or `"parking_lot"` (the
/// `parking-lot-arena-lock` feature). Benchmarks print it, so that runs of the two builds can be
/// told apart.
pub const ARENA_LOCK: &str = if cfg!(feature = "parking-lot-arena-lock") { "parking_lot" } else { "spin" };

/// A lock around `T`: spin-then-yield (the default), or `parking_lot`'s raw mutex with the
/// `parking-lot-arena-lock` feature.
pub(crate) struct ArenaLock<T> {
    #[cfg(not(feature = "parking-lot-arena-lock"))]
    locked: AtomicBool,
    #[cfg(feature = "parking-lot-arena-lock")]
    raw: parking_lot::RawMutex,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives `&mut T` to one thread at a time (acquire on lock, release on unlock
// order every access, for either kind of lock), so `T: Send` suffices, as for
// `std::sync::Mutex`.
unsafe impl<T: Send> Send for ArenaLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for ArenaLock<T> {}

impl<T> ArenaLock<T> {
    pub(crate) fn new(value: T) -> Self {
        ArenaLock {
            #[cfg(not(feature = "parking-lot-arena-lock"))]
            locked: AtomicBool::new(false),
            #[cfg(feature = "parking-lot-arena-lock")]
            raw: <parking_lot::RawMutex as RawMutex>::INIT,
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> ArenaGuard<'_, T> {
        #[cfg(feature = "parking-lot-arena-lock")]
        self.raw.lock();
        #[cfg(not(feature = "parking-lot-arena-lock"))]
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        ArenaGuard { lock: self }
    }

    /// [`ArenaLock::lock`], and whether the lock was held by another thread when this one came
    /// (it had to wait): how a thread finds that it shares its arena with busy threads.
    #[inline]
    pub(crate) fn lock_noting_contention(&self) -> (ArenaGuard<'_, T>, bool) {
        #[cfg(feature = "parking-lot-arena-lock")]
        let contended = !self.raw.try_lock() && {
            self.raw.lock();
            true
        };
        #[cfg(not(feature = "parking-lot-arena-lock"))]
        let contended =
            self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
                && {
                    self.lock_contended();
                    true
                };
        (ArenaGuard { lock: self }, contended)
    }

    #[cfg(not(feature = "parking-lot-arena-lock"))]
    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                // The model checker runs one thread at a time: a waiter must let it switch.
                #[cfg(loom)]
                loom::thread::yield_now();
                if spins < 64 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    // The holder may have been preempted: let it run.
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

/// Exclusive access to an [`ArenaLock`]'s value until dropped.
pub(crate) struct ArenaGuard<'a, T> {
    lock: &'a ArenaLock<T>,
}

impl<T> Deref for ArenaGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for ArenaGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while this thread holds the lock, and `&mut self` makes
        // this the only reference derived from it.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ArenaGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "parking-lot-arena-lock")]
        // SAFETY: a guard is made only by `lock`, which locked `raw` on this thread; this drop is
        // the one unlock of that lock.
        unsafe {
            self.lock.raw.unlock()
        };
        #[cfg(not(feature = "parking-lot-arena-lock"))]
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A lent chunk's pointer to its arena, without a reference count.
///
/// Invariant (upheld by the pool): an arena that has chunks lent out is always owned by at least
/// one `Arc` that nobody drops while the count of lent chunks, kept under the arena's lock, is
/// non-zero: the pool's map while the pool lives (an arena leaves the map only when it holds no
/// chunk at all), and after the pool is dropped, one `Arc` deliberately leaked by
/// [`ArenaRef::keep_alive`] and given back by [`ArenaRef::release_kept`] when the last chunk
/// returns.
pub(crate) struct ArenaRef<T>(NonNull<T>);

// SAFETY: `ArenaRef` is a shared reference in all but lifetime; the arena it points to is `Sync`.
unsafe impl<T: Sync> Send for ArenaRef<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for ArenaRef<T> {}

impl<T> ArenaRef<T> {
    /// A pointer to the arena `arc` owns; valid as long as the invariant above holds. Made from
    /// the `Arc`'s own pointer (not from a shared reference to its contents), so that
    /// [`ArenaRef::release_kept`] may later give back a strong count through it.
    pub(crate) fn new(arc: &Arc<T>) -> Self {
        // `Arc::as_ptr` is never null.
        ArenaRef(NonNull::new(Arc::as_ptr(arc).cast_mut()).unwrap_or_else(|| unreachable!()))
    }

    /// Another pointer to the same arena, for a newly lent chunk (the arena counts it under its
    /// lock, which keeps the invariant).
    pub(crate) fn clone_ref(&self) -> Self {
        ArenaRef(self.0)
    }

    /// The arena.
    #[inline]
    pub(crate) fn get(&self) -> &T {
        // SAFETY: this `ArenaRef` belongs to a lent chunk, and by the invariant the arena outlives
        // every lent chunk.
        unsafe { self.0.as_ref() }
    }

    /// Leaks one strong reference to `arc`, keeping the arena alive once its pool is gone.
    pub(crate) fn keep_alive(arc: &Arc<T>) {
        std::mem::forget(Arc::clone(arc));
    }

    /// Gives back the reference leaked by [`ArenaRef::keep_alive`]; the arena may be freed here.
    ///
    /// # Safety
    ///
    /// `keep_alive` was called for this arena and this is the one matching call (the last lent
    /// chunk just came back), and `self` is not used afterwards.
    pub(crate) unsafe fn release_kept(self) {
        // SAFETY: the pointer came from an `Arc<T>` whose count `keep_alive` raised by one; the
        // caller guarantees this is the matching decrement.
        unsafe { Arc::decrement_strong_count(self.0.as_ptr()) }
    }
}

/// A pool's arenas as seen by one thread: the last few `(pool, key)` pairs it used. The runtime
/// keeps one per thread and lends it to every allocation, so a cache hit finds its arena without
/// a map lookup or a reference count.
///
/// Entries are type-erased (one cache serves pools of every raw allocator type): each holds the
/// arena's `Arc` as `dyn Any` (which keeps it alive) and the same `Arc`'s pointer. Only the pool
/// whose number an entry carries reads it back, as its own arena type: pool numbers are unique in
/// the process and a pool has one arena type, which is what makes the cast in `ArenaCache::with`
/// sound.
pub struct ArenaCache {
    entries: RefCell<Vec<CacheEntry>>,
    /// Waits for an arena's lock seen by this thread's allocations in the current window, and
    /// the arena's allocation count when the window began (see [`ArenaCache::note_contention`]).
    contended: Cell<u32>,
    window_start: Cell<u64>,
}

struct CacheEntry {
    pool: u64,
    key: ArenaKey,
    arena: NonNull<()>,
    owner: Arc<dyn Any + Send + Sync>,
}

const ARENA_CACHE_SIZE: usize = 8;

/// The window, in an arena's allocations (by all its threads), over which a thread's waits for
/// its lock are counted.
pub(crate) const CONTENTION_WINDOW: u64 = 8192;

/// Waits within one window after which a thread on the null stream moves to a lane of its own:
/// one in 128 of the arena's allocations. The window counts every thread's allocations and a
/// thread waits only for some of its own (a thread that has just unlocked often takes the lock
/// again before the waiting ones), so the bound must hold with many threads: eight threads
/// allocating at once on the H200's host did not reach one wait in sixteen of the arena's
/// allocations each, and stayed on one arena at a tenth of one thread's rate. Threads that
/// allocate at the same time reach one in 128 within a few microseconds; a thread that takes
/// turns with another (a training loop's forward and backward threads) does not.
pub(crate) const LANE_AFTER_WAITS: u32 = 64;

impl ArenaCache {
    /// An empty cache. A `const fn`, so a `thread_local!` holding one needs no lazy
    /// initialisation on the hot path.
    #[must_use]
    pub const fn new() -> Self {
        ArenaCache { entries: RefCell::new(Vec::new()), contended: Cell::new(0), window_start: Cell::new(0) }
    }

    /// Counts a wait for the lock of an arena that has made `allocations` allocations in all.
    /// The waits are counted in windows of [`CONTENTION_WINDOW`] of the arena's allocations (by
    /// every thread): a thread that waits now and then, as two threads taking turns do, starts
    /// a new window each time and never reaches [`LANE_AFTER_WAITS`].
    /// Returns [`ArenaCache::wants_lane`].
    #[cold]
    pub(crate) fn note_contention(&self, allocations: u64) -> bool {
        let (waits, start) = (self.contended.get(), self.window_start.get());
        if waits == 0 || allocations.wrapping_sub(start) > CONTENTION_WINDOW {
            self.window_start.set(allocations);
            self.contended.set(1);
        } else {
            self.contended.set(waits + 1);
        }
        self.wants_lane()
    }

    /// Whether this thread waited for its arena's lock [`LANE_AFTER_WAITS`] times within one
    /// window: it shares the arena with threads that allocate at the same time.
    #[inline(always)]
    pub(crate) fn wants_lane(&self) -> bool {
        self.contended.get() >= LANE_AFTER_WAITS
    }

    /// Starts counting waits afresh (after the thread moved to an arena of its own).
    pub(crate) fn reset_contention(&self) {
        self.contended.set(0);
    }

    /// Applies `f` to pool `pool`'s arena `key` if the cache has it; `None` otherwise (and when
    /// the cache is busy, which only a re-entrant call from `f` could make it).
    #[inline(always)]
    pub(crate) fn with<A: Send + Sync + 'static, T>(
        &self,
        pool: u64,
        key: ArenaKey,
        f: impl FnOnce(&ArenaRef<A>) -> T,
    ) -> Option<T> {
        let entries = self.entries.try_borrow().ok()?;
        let e = entries.iter().find(|e| e.pool == pool && e.key == key)?;
        // SAFETY: entries of pool `pool` are put only by that pool, as `Arc<A>` of its one arena
        // type `A` (see the type's docs), and `e.owner` keeps the arena alive while the entry
        // exists, which is longer than `f` runs (the entries are borrowed meanwhile).
        let arena = ArenaRef(e.arena.cast::<A>());
        Some(f(&arena))
    }

    /// Pool `pool`'s arena `key`, as a counted reference.
    pub(crate) fn get<A: Send + Sync + 'static>(&self, pool: u64, key: ArenaKey) -> Option<Arc<A>> {
        let entries = self.entries.try_borrow().ok()?;
        let e = entries.iter().find(|e| e.pool == pool && e.key == key)?;
        Arc::clone(&e.owner).downcast::<A>().ok()
    }

    /// Remembers pool `pool`'s arena `key`, evicting the least recently added entry when full.
    pub(crate) fn put<A: Send + Sync + 'static>(&self, pool: u64, key: ArenaKey, arena: Arc<A>) {
        let Ok(mut entries) = self.entries.try_borrow_mut() else { return };
        entries.retain(|e| !(e.pool == pool && e.key == key));
        if entries.len() >= ARENA_CACHE_SIZE {
            entries.pop();
        }
        let ptr = NonNull::new(Arc::as_ptr(&arena).cast_mut().cast::<()>()).unwrap_or_else(|| unreachable!());
        entries.insert(0, CacheEntry { pool, key, arena: ptr, owner: arena });
    }
}

impl Default for ArenaCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ArenaCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.entries.try_borrow().map_or(0, |e| e.len());
        write!(f, "ArenaCache({n} arenas)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock keeps a counter that threads increment under it exact (the default build tests
    /// the spinning lock, a build with `parking-lot-arena-lock` parking_lot's).
    #[test]
    fn the_lock_excludes() {
        let (threads, rounds) = if cfg!(miri) { (3, 50) } else { (4, 20_000) };
        let lock = Arc::new(ArenaLock::new(0u64));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..rounds {
                        let mut g = lock.lock();
                        // A read and a write apart: a lock that let two threads in would lose
                        // increments.
                        let v = *g;
                        std::hint::spin_loop();
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*lock.lock(), threads * rounds, "{ARENA_LOCK}");
    }
}
