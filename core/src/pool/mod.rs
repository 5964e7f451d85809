//! The caching memory pool: CuPy's `SingleDeviceMemoryPool` and `MemoryPool`.
//!
//! # Rules (CuPy's, from `spec/cupy-behaviour.md` §1)
//!
//! - Sizes are rounded up to [`ALLOCATION_UNIT_SIZE`] (512 bytes); a cache miss asks the raw
//!   allocator for exactly the rounded size.
//! - Free chunks are kept per *arena*, one per stream: the current stream when `malloc` runs (the
//!   null stream's arena is shared by every thread using it; the per-thread default stream gives
//!   each thread its own). A chunk goes back to the arena it came from, whatever stream is current
//!   when it is freed, so memory is only reused in the order of the stream it was allocated on.
//! - `malloc` takes the smallest free chunk at least as large as the request (best fit), splits
//!   it, lends the head and keeps the rest free. Freeing merges a chunk with its free neighbours
//!   of the same raw allocation only.
//! - `free_all_blocks` releases the free chunks that are whole raw allocations; a split allocation
//!   stays until its parts merge back.
//! - The limit bounds the bytes held from the device (`total_bytes`). A miss that would pass it,
//!   or that the device cannot serve, releases the cached blocks of every arena and retries: twice
//!   for the limit, three raw attempts for the device; then the error carries CuPy's message.
//!
//! # Speed
//!
//! A cache hit takes one thread-local read (the current stream's arena key and the arena itself,
//! from a small per-thread cache), one lock of that arena's own lock, and a bin pop (or two bit
//! scans when the exact size is not free). A lent chunk finds its arena again without a reference
//! count, so an allocate + free pair costs two atomic read-modify-writes in all. Arenas of
//! different streams share no lock and no counter on the hot path, so threads on their own
//! streams scale. Hooks cost one relaxed atomic load while no thread has one installed.
//!
//! The pool's logic is safe code; the two hot-path devices that need `unsafe` (the arena lock and
//! the uncounted arena pointer) are in the `sync` module, with the invariant that makes them sound.

#![allow(clippy::module_name_repetitions)]

mod arena;
mod index;
mod limit;
mod multi;
mod sync;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::{Backend, DeviceId, DevicePtr};
use crate::error::{Error, Result};
use crate::hooks::{self, AllocEvent, FreeEvent, MallocEvent};
use crate::memory::{BaseMemory, Memory, MemoryPointer};
use crate::stream::Stream;

use arena::{ArenaState, Lent};
pub use limit::{Limit, LIMIT_ENV};
pub use multi::MemoryPool;
use sync::{ArenaLock, ArenaRef};

/// The pool's allocation unit: every size is rounded up to a multiple of it (CuPy's
/// `_allocation_unit_size`).
pub const ALLOCATION_UNIT_SIZE: usize = 512;
pub(crate) const UNIT: usize = ALLOCATION_UNIT_SIZE;

/// `size` rounded up to the allocation unit; `None` when that overflows (CuPy wraps around
/// instead, and would hand out a tiny chunk).
#[must_use]
pub fn round_size(size: usize) -> Option<usize> {
    size.checked_add(UNIT - 1).map(|s| s / UNIT * UNIT)
}

/// Allocates the raw blocks a pool carves up. The default, [`DeviceAllocator`], calls the
/// runtime; tests supply fault-injecting or mock allocators, and embedders their own.
pub trait RawAllocator<B: Backend>: Send + Sync {
    /// Allocates `size > 0` bytes on `device`.
    ///
    /// # Errors
    ///
    /// An out-of-memory error ([`Error::is_out_of_memory`]) makes the pool release its cache and
    /// retry; any other error goes to the caller as is.
    fn allocate(&self, device: DeviceId, size: usize) -> Result<Box<dyn BaseMemory<B>>>;
}

/// The runtime's device allocator ([`Memory::new_on`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceAllocator;

impl<B: Backend> RawAllocator<B> for DeviceAllocator {
    fn allocate(&self, device: DeviceId, size: usize) -> Result<Box<dyn BaseMemory<B>>> {
        Ok(Box::new(Memory::<B>::new_on(device, size)?))
    }
}

impl<B: Backend, F> RawAllocator<B> for F
where
    F: Fn(DeviceId, usize) -> Result<Box<dyn BaseMemory<B>>> + Send + Sync,
{
    fn allocate(&self, device: DeviceId, size: usize) -> Result<Box<dyn BaseMemory<B>>> {
        self(device, size)
    }
}

/// How a pool trades memory held from the device against calls to the raw allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GrowthPolicy {
    /// CuPy's rule: cached blocks stay until an allocation cannot be served (or
    /// `free_all_blocks` is called). Fewest raw calls; the cache can hold much more than is in use,
    /// most of all with several streams, whose arenas do not share.
    #[default]
    CacheUntilOutOfMemory,
    /// Before asking the raw allocator for a new block, release the cached whole blocks of every
    /// arena. The pool then holds little more than what is in use (plus the free parts of split
    /// blocks), at the price of raw frees and allocations on misses: a cache hit costs the same.
    ReleaseBeforeGrow,
    /// Hold little more than the most memory in use at once so far (as seen at misses). Before a
    /// new block, release cached whole blocks, largest first, just enough for that; and lend a
    /// cached chunk only if it exceeds the request by at most an eighth, so large free blocks are
    /// not cut up for small requests (their remainders would pin them). A program whose use peaks
    /// at the same level each iteration (a training loop) keeps its cache; one whose pattern
    /// wanders does not pile up memory. gpumem's lowest-fragmentation policy (see BENCHMARKS.md).
    HoldPeakInUse,
}

/// Which arena a stream's allocations go to: the stream's raw handle, or a per-thread number for
/// the per-thread default stream (whose raw value, 2, is the same on every thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArenaKey(u64);

impl ArenaKey {
    /// The null stream's arena.
    pub const NULL: ArenaKey = ArenaKey(0);
    /// Not yet known (a thread's state before its first allocation).
    pub(crate) const UNSET: ArenaKey = ArenaKey(u64::MAX);
    const PER_THREAD: u64 = 1 << 63;

    pub(crate) fn stream(raw: usize) -> ArenaKey {
        ArenaKey(raw as u64 & !Self::PER_THREAD)
    }

    pub(crate) fn per_thread(thread: u64) -> ArenaKey {
        ArenaKey(Self::PER_THREAD | thread)
    }
}

struct Shared<B: Backend> {
    uid: u64,
    device: DeviceId,
    allocator: Arc<dyn RawAllocator<B>>,
    total_bytes: AtomicUsize,
    /// 0: unlimited.
    limit: AtomicUsize,
    /// `GrowthPolicy` as 0, 1 or 2.
    policy: AtomicU8,
    /// The most bytes seen in use at once, sampled at misses (`HoldPeakInUse`).
    peak_in_use: AtomicUsize,
}

pub(crate) struct Arena<B: Backend> {
    uid: u32,
    shared: Arc<Shared<B>>,
    state: ArenaLock<ArenaState<B>>,
}

/// A pool's arenas as seen by one thread: the last few `(pool, key)` pairs it used.
pub(crate) struct ArenaCache<B: Backend> {
    entries: RefCell<Vec<CacheEntry<B>>>,
}

/// `(pool, key, arena)`.
type CacheEntry<B> = (u64, ArenaKey, Arc<Arena<B>>);

const ARENA_CACHE_SIZE: usize = 8;

impl<B: Backend> ArenaCache<B> {
    pub(crate) const fn new() -> Self {
        ArenaCache { entries: RefCell::new(Vec::new()) }
    }

    fn get(&self, pool: u64, key: ArenaKey) -> Option<Arc<Arena<B>>> {
        self.entries.borrow().iter().find(|(p, k, _)| *p == pool && *k == key).map(|(_, _, a)| Arc::clone(a))
    }

    fn put(&self, pool: u64, key: ArenaKey, arena: Arc<Arena<B>>) {
        let mut entries = self.entries.borrow_mut();
        entries.retain(|(p, k, _)| !(*p == pool && *k == key));
        if entries.len() >= ARENA_CACHE_SIZE {
            entries.pop();
        }
        entries.insert(0, (pool, key, arena));
    }
}

/// A pool for one device: CuPy's `SingleDeviceMemoryPool`. See the [module docs](self).
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{Limit, SingleDeviceMemoryPool};
///
/// let pool = SingleDeviceMemoryPool::<Host>::new(0)?;
/// let a = pool.malloc(1000)?; // 1024 bytes
/// let b = pool.malloc(2048)?;
/// assert_eq!((pool.used_bytes(), pool.total_bytes()), (3072, 3072));
/// drop(b);
/// assert_eq!((pool.free_bytes(), pool.n_free_blocks()), (2048, 1));
/// pool.set_limit(Limit::Bytes(4096))?;
/// // Before giving up, the pool released its cached 2048-byte block and retried.
/// assert_eq!(
///     pool.malloc(4096).unwrap_err().to_string(),
///     "Out of memory allocating 4,096 bytes (allocated so far: 1,024 bytes, limit set to: 4,096 bytes)."
/// );
/// drop(a);
/// pool.free_all_blocks(None);
/// assert_eq!(pool.total_bytes(), 0);
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct SingleDeviceMemoryPool<B: Backend> {
    shared: Arc<Shared<B>>,
    arenas: Mutex<HashMap<ArenaKey, Arc<Arena<B>>>>,
    next_arena: AtomicU32,
}

impl<B: Backend> fmt::Debug for SingleDeviceMemoryPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleDeviceMemoryPool")
            .field("device", &self.shared.device)
            .field("used_bytes", &self.used_bytes())
            .field("total_bytes", &self.total_bytes())
            .field("limit", &self.get_limit())
            .finish_non_exhaustive()
    }
}

fn next_pool_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl<B: Backend> SingleDeviceMemoryPool<B> {
    /// A pool for `device` on the runtime's allocator, limited by `GPUMEM_GPU_MEMORY_LIMIT` if it
    /// is set.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the variable cannot be parsed; the runtime's error when a fraction
    /// needs the device's memory size.
    pub fn new(device: DeviceId) -> Result<Self> {
        Self::with_allocator(device, Arc::new(DeviceAllocator))
    }

    /// A pool for `device` on the given raw allocator, limited by `GPUMEM_GPU_MEMORY_LIMIT` if it
    /// is set.
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::new`].
    pub fn with_allocator(device: DeviceId, allocator: Arc<dyn RawAllocator<B>>) -> Result<Self> {
        let pool = SingleDeviceMemoryPool {
            shared: Arc::new(Shared {
                uid: next_pool_uid(),
                device,
                allocator,
                total_bytes: AtomicUsize::new(0),
                limit: AtomicUsize::new(0),
                policy: AtomicU8::new(0),
                peak_in_use: AtomicUsize::new(0),
            }),
            arenas: Mutex::new(HashMap::new()),
            next_arena: AtomicU32::new(1),
        };
        if let Some(limit) = Limit::from_env()? {
            pool.set_limit(limit)?;
        }
        Ok(pool)
    }

    /// The device this pool allocates on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.shared.device
    }

    /// Allocates `size` bytes and returns a [`MemoryPointer`] to them (CuPy's `malloc`). Size 0
    /// gives a pointer to an empty, unpooled [`Memory`], as in CuPy.
    ///
    /// # Errors
    ///
    /// `LimitExceeded` or `OutOfMemory` (CuPy's messages) once the retries are exhausted; a
    /// hook's error; the raw allocator's other errors.
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        let pooled = self.malloc_pooled(size)?;
        if !pooled.is_chunk() {
            return Ok(MemoryPointer::from_memory(Memory::<B>::new_on(self.shared.device, 0)?));
        }
        Ok(MemoryPointer::from_memory(pooled))
    }

    /// Allocates `size` bytes and returns the chunk itself, which goes back to the pool when
    /// dropped. This is the pool's fastest path: no reference-counted pointer is made.
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::malloc`].
    pub fn malloc_pooled(&self, size: usize) -> Result<PooledMemory<B>> {
        let mem_size = round_size(size).ok_or_else(|| Error::OutOfMemory { size, total: None })?;
        if !hooks::active() {
            return self.lend(mem_size, false);
        }
        self.malloc_hooked(size, mem_size)
    }

    #[cold]
    fn malloc_hooked(&self, size: usize, mem_size: usize) -> Result<PooledMemory<B>> {
        let device_id = self.shared.device;
        let pre = MallocEvent { device_id, size, mem_size, mem_ptr: 0, pmem_id: 0 };
        hooks::fire("malloc_preprocess", |h| h.malloc_preprocess(&pre))?;
        let result = self.lend(mem_size, true);
        let post = match &result {
            Ok(p) => MallocEvent { mem_ptr: p.ptr, pmem_id: p.pmem_id(), ..pre },
            Err(_) => pre,
        };
        // On a post-hook error the allocation is dropped here, so the chunk goes back (firing the
        // free hooks, as in CuPy) and nothing leaks.
        hooks::fire("malloc_postprocess", |h| h.malloc_postprocess(&post))?;
        result
    }

    /// Lends a chunk of `mem_size` (already rounded) bytes from the current stream's arena.
    #[inline]
    fn lend(&self, mem_size: usize, hooked: bool) -> Result<PooledMemory<B>> {
        if mem_size == 0 {
            return Ok(PooledMemory::empty(self.shared.device));
        }
        // The hot path: the arena from this thread's cache, a chunk from its free index, all
        // without touching a reference count.
        let uid = self.shared.uid;
        let hit = B::thread_state().with(|ts| {
            let key = ts.arena_key();
            let cache = ts.arenas.entries.borrow();
            let (_, _, arena) = cache.iter().find(|(p, k, _)| *p == uid && *k == key)?;
            let mut st = arena.state.lock();
            if st.retired {
                return None;
            }
            let lent = st.take(mem_size)?;
            drop(st);
            Some(PooledMemory::lent(arena, lent, mem_size))
        });
        match hit {
            Some(p) => Ok(p),
            None => self.lend_slow(mem_size, hooked),
        }
    }

    #[cold]
    fn lend_slow(&self, mem_size: usize, hooked: bool) -> Result<PooledMemory<B>> {
        let arena = self.current_arena();
        {
            let mut st = arena.state.lock();
            if !st.retired {
                if let Some(lent) = st.take(mem_size) {
                    drop(st);
                    return Ok(PooledMemory::lent(&arena, lent, mem_size));
                }
            }
        }
        self.grow(mem_size, hooked)
    }

    /// The current stream's arena, from the thread's cache or the pool's map.
    #[inline]
    fn current_arena(&self) -> Arc<Arena<B>> {
        let uid = self.shared.uid;
        B::thread_state()
            .with(|ts| {
                let key = ts.arena_key();
                ts.arenas.get(uid, key).ok_or(key)
            })
            .unwrap_or_else(|key| self.arena_slow(key))
    }

    #[cold]
    fn arena_slow(&self, key: ArenaKey) -> Arc<Arena<B>> {
        let arena = self.arena_in_map(key);
        B::thread_state().with(|ts| ts.arenas.put(self.shared.uid, key, Arc::clone(&arena)));
        arena
    }

    fn arena_in_map(&self, key: ArenaKey) -> Arc<Arena<B>> {
        let mut arenas = self.arenas.lock();
        Arc::clone(arenas.entry(key).or_insert_with(|| {
            let mut state = ArenaState::new();
            state.bounded_split = self.growth_policy() == GrowthPolicy::HoldPeakInUse;
            Arc::new(Arena {
                uid: self.next_arena.fetch_add(1, Ordering::Relaxed),
                shared: Arc::clone(&self.shared),
                state: ArenaLock::new(state),
            })
        }))
    }

    /// A cache miss: reserve against the limit, allocate a raw block (with the retry ladder) and
    /// lend all of it from the current stream's arena.
    #[cold]
    fn grow(&self, mem_size: usize, hooked: bool) -> Result<PooledMemory<B>> {
        match self.growth_policy() {
            GrowthPolicy::CacheUntilOutOfMemory => {}
            GrowthPolicy::ReleaseBeforeGrow => self.free_all_blocks(None),
            GrowthPolicy::HoldPeakInUse => {
                let in_use = self.used_bytes() + mem_size;
                let peak = self.shared.peak_in_use.fetch_max(in_use, Ordering::Relaxed).max(in_use);
                let excess = (self.total_bytes() + mem_size).saturating_sub(peak);
                if excess > 0 {
                    self.release_cached(excess);
                }
            }
        }
        self.reserve(mem_size)?;
        let mem = match self.allocate_raw(mem_size, hooked) {
            Ok(mem) => mem,
            Err(e) => {
                self.shared.total_bytes.fetch_sub(mem_size, Ordering::Relaxed);
                return Err(match e {
                    Error::OutOfMemory { .. } => {
                        Error::OutOfMemory { size: mem_size, total: Some(self.total_bytes()) }
                    }
                    other => other,
                });
            }
        };
        let mut mem = Some(mem);
        loop {
            let arena = self.current_arena();
            let mut st = arena.state.lock();
            if st.retired {
                // Retired by a concurrent `free_all_blocks` since we looked: take the new one.
                drop(st);
                let key = B::thread_state().with(|ts| ts.arena_key());
                let fresh = self.arena_in_map(key);
                B::thread_state().with(|ts| ts.arenas.put(self.shared.uid, key, fresh));
                continue;
            }
            let lent = st.lend_new_block(mem.take().expect("the block is lent once"), mem_size);
            drop(st);
            return Ok(PooledMemory::lent(&arena, lent, mem_size));
        }
    }

    /// Reserves `size` bytes against the limit, releasing cached blocks and retrying twice.
    fn reserve(&self, size: usize) -> Result<()> {
        let limit = self.get_limit();
        let exceeded = |pool: &Self| Error::LimitExceeded { size, total: pool.total_bytes(), limit };
        if limit != 0 && size > limit {
            return Err(exceeded(self));
        }
        for attempt in 0..3 {
            if attempt > 0 {
                self.free_all_blocks(None);
            }
            let fits = self.shared.total_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                total.checked_add(size).filter(|&t| limit == 0 || t <= limit)
            });
            if fits.is_ok() {
                return Ok(());
            }
        }
        Err(exceeded(self))
    }

    /// Asks the raw allocator for `size` bytes: three attempts, releasing every arena's cached
    /// blocks before the second and the third, with the alloc hooks around each.
    fn allocate_raw(&self, size: usize, hooked: bool) -> Result<Box<dyn BaseMemory<B>>> {
        let device_id = self.shared.device;
        let mut attempt = 0;
        loop {
            let pre = AllocEvent { device_id, mem_size: size, mem_ptr: 0 };
            if hooked {
                hooks::fire("alloc_preprocess", |h| h.alloc_preprocess(&pre))?;
            }
            let result = self.shared.allocator.allocate(device_id, size);
            if hooked {
                let mem_ptr = result.as_ref().map_or(0, |m| m.ptr());
                // On error the new block (if any) is dropped, i.e. freed: nothing leaks.
                hooks::fire("alloc_postprocess", |h| h.alloc_postprocess(&AllocEvent { mem_ptr, ..pre }))?;
            }
            match result {
                Err(e) if e.is_out_of_memory() && attempt < 2 => {
                    attempt += 1;
                    self.free_all_blocks(None);
                }
                other => return other,
            }
        }
    }

    /// Releases the free chunks that are whole raw blocks, in every arena (`None`) or in the
    /// arena of `stream` (CuPy's `free_all_blocks(stream=None)`). Arenas left with no memory at
    /// all are dropped from the pool.
    pub fn free_all_blocks(&self, stream: Option<&Stream<B>>) {
        let arenas: Vec<(ArenaKey, Arc<Arena<B>>)> = {
            let map = self.arenas.lock();
            match stream {
                None => map.iter().map(|(k, a)| (*k, Arc::clone(a))).collect(),
                Some(s) => {
                    map.get(&s.arena_key()).map(|a| (s.arena_key(), Arc::clone(a))).into_iter().collect()
                }
            }
        };
        let mut released = Vec::new();
        for (key, arena) in arenas {
            let bytes;
            let empty;
            {
                let mut st = arena.state.lock();
                bytes = st.release_free_blocks(&mut released);
                empty = st.is_empty();
            }
            self.shared.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if empty {
                let mut map = self.arenas.lock();
                let mut st = arena.state.lock();
                // Re-checked under both locks: a thread may have allocated from it meanwhile.
                if st.is_empty() && map.get(&key).is_some_and(|a| Arc::ptr_eq(a, &arena)) {
                    st.retired = true;
                    map.remove(&key);
                }
            }
        }
        // The raw frees (driver calls) run after every lock is released.
        drop(released);
    }

    /// CuPy's deprecated alias of [`free_all_blocks`](Self::free_all_blocks).
    #[deprecated(note = "free_all_free is deprecated. Use free_all_blocks instead.")]
    pub fn free_all_free(&self) {
        self.free_all_blocks(None);
    }

    /// Releases cached whole blocks of any arena, largest first, until at least `bytes` are
    /// released or none is left.
    fn release_cached(&self, bytes: usize) {
        let arenas: Vec<Arc<Arena<B>>> = self.arenas.lock().values().cloned().collect();
        let mut candidates: Vec<(usize, u32, usize)> = Vec::new();
        for (i, arena) in arenas.iter().enumerate() {
            let st = arena.state.lock();
            candidates.extend(st.whole_free_blocks().into_iter().map(|(slot, size)| (size, slot, i)));
        }
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let mut released = Vec::new();
        let mut done = 0;
        for (size, slot, i) in candidates {
            if done >= bytes {
                break;
            }
            if let Some(mem) = arenas[i].state.lock().release_whole(slot, size) {
                self.shared.total_bytes.fetch_sub(size, Ordering::Relaxed);
                released.push(mem);
                done += size;
            }
        }
        drop(released);
    }

    fn sum_arenas(&self, f: impl Fn(&ArenaState<B>) -> usize) -> usize {
        let arenas: Vec<Arc<Arena<B>>> = self.arenas.lock().values().cloned().collect();
        arenas.iter().map(|a| f(&a.state.lock())).sum()
    }

    /// Bytes lent out (rounded sizes).
    #[must_use]
    pub fn used_bytes(&self) -> usize {
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

    /// Sets the limit on bytes held from the device (CuPy's `set_limit(size=..)` or
    /// `set_limit(fraction=..)`); `Limit::Bytes(0)` and `Limit::Fraction(0.0)` mean unlimited.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a fraction out of `0..=1` ("memory limit fraction out of range",
    /// CuPy's message); the runtime's error when a fraction needs the device's memory size.
    pub fn set_limit(&self, limit: Limit) -> Result<()> {
        limit.validate()?;
        let bytes = match limit {
            Limit::Bytes(b) => b,
            Limit::Fraction(0.0) => 0,
            Limit::Fraction(_) => limit.bytes(B::mem_get_info(self.shared.device)?.total),
        };
        self.shared.limit.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The limit in bytes; 0 when unlimited.
    #[must_use]
    pub fn get_limit(&self) -> usize {
        self.shared.limit.load(Ordering::Relaxed)
    }

    /// Sets how the pool grows (CuPy's rule by default).
    pub fn set_growth_policy(&self, policy: GrowthPolicy) {
        let map = self.arenas.lock();
        self.shared.policy.store(policy as u8, Ordering::Relaxed);
        for arena in map.values() {
            arena.state.lock().bounded_split = policy == GrowthPolicy::HoldPeakInUse;
        }
    }

    /// How the pool grows.
    #[must_use]
    pub fn growth_policy(&self) -> GrowthPolicy {
        match self.shared.policy.load(Ordering::Relaxed) {
            0 => GrowthPolicy::CacheUntilOutOfMemory,
            1 => GrowthPolicy::ReleaseBeforeGrow,
            _ => GrowthPolicy::HoldPeakInUse,
        }
    }

    /// The free chunks of the current stream's arena as `(ptr, size)`, for debugging.
    #[must_use]
    pub fn free_chunks_of_current_stream(&self) -> Vec<(DevicePtr, usize)> {
        self.current_arena().state.lock().free_chunks()
    }
}

impl<B: Backend> Drop for SingleDeviceMemoryPool<B> {
    fn drop(&mut self) {
        self.free_all_blocks(None);
        // Arenas with chunks still lent out outlive the pool: each is orphaned and kept alive
        // until its last chunk comes back; meanwhile every chunk that comes back releases its raw
        // block as soon as the block is whole again.
        for arena in self.arenas.get_mut().values() {
            let mut st = arena.state.lock();
            let mut released = Vec::new();
            let bytes = st.release_free_blocks(&mut released);
            self.shared.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if st.n_lent > 0 {
                st.orphaned = true;
                ArenaRef::keep_alive(arena);
            }
            drop(st);
            drop(released);
        }
    }
}

/// A chunk lent by a pool; it goes back to the pool when dropped (CuPy's `PooledMemory`).
pub struct PooledMemory<B: Backend> {
    arena: Option<ArenaRef<Arena<B>>>,
    slot: u32,
    device: DeviceId,
    ptr: DevicePtr,
    size: usize,
    /// The id hooks see for a zero-size allocation, which has no chunk.
    empty_id: u64,
}

impl<B: Backend> PooledMemory<B> {
    /// The chunk `lent` by `arena`, of `size` (rounded) bytes.
    #[inline]
    fn lent(arena: &Arc<Arena<B>>, lent: Lent, size: usize) -> Self {
        let device = arena.shared.device;
        PooledMemory {
            arena: Some(ArenaRef::new(arena)),
            slot: lent.slot,
            device,
            ptr: lent.ptr,
            size,
            empty_id: 0,
        }
    }

    fn empty(device: DeviceId) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PooledMemory {
            arena: None,
            slot: 0,
            device,
            ptr: 0,
            size: 0,
            empty_id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether this is a real chunk (not a zero-size allocation).
    fn is_chunk(&self) -> bool {
        self.arena.is_some()
    }

    /// An identifier unique among the chunks lent at one time (CuPy's `pmem_id`, there the
    /// address of the chunk's object): the hooks report it for `malloc` and the matching `free`.
    #[must_use]
    pub fn pmem_id(&self) -> u64 {
        match &self.arena {
            Some(arena) => pmem_id_of(arena.get(), self.slot),
            None => self.empty_id,
        }
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
    /// and discards the error). The chunk goes back even when a hook fails.
    ///
    /// # Errors
    ///
    /// The first error a free hook returned.
    pub fn free(mut self) -> Result<()> {
        match self.arena.take() {
            None => Ok(()),
            Some(arena) if !hooks::active() => {
                give_back(arena, self.slot);
                Ok(())
            }
            Some(arena) => self.free_hooked(arena),
        }
    }

    #[cold]
    fn free_hooked(&self, arena: ArenaRef<Arena<B>>) -> Result<()> {
        let event = FreeEvent {
            device_id: self.device,
            mem_size: self.size,
            mem_ptr: self.ptr,
            pmem_id: pmem_id_of(arena.get(), self.slot),
        };
        // The guard returns the chunk even if a pre-hook fails or panics.
        let guard = GiveBackOnDrop(Some((arena, self.slot)));
        let pre = hooks::fire("free_preprocess", |h| h.free_preprocess(&event));
        drop(guard);
        let post = hooks::fire("free_postprocess", |h| h.free_postprocess(&event));
        pre.and(post)
    }
}

/// Arena and slot identify a lent chunk among those lent at one time; the pool's number keeps
/// two pools' chunks apart. Never 0 (arena numbers start at 1), which hooks read as "failed".
fn pmem_id_of<B: Backend>(arena: &Arena<B>, slot: u32) -> u64 {
    ((u64::from(arena.uid) << 32) | u64::from(slot)) ^ (arena.shared.uid << 52)
}

struct GiveBackOnDrop<B: Backend>(Option<(ArenaRef<Arena<B>>, u32)>);

impl<B: Backend> Drop for GiveBackOnDrop<B> {
    fn drop(&mut self) {
        if let Some((arena, slot)) = self.0.take() {
            give_back(arena, slot);
        }
    }
}

/// Returns a chunk to its arena.
#[inline]
#[allow(unsafe_code)] // ending an orphaned arena; see `ArenaRef`
fn give_back<B: Backend>(arena: ArenaRef<Arena<B>>, slot: u32) {
    let a = arena.get();
    let mut st = a.state.lock();
    let released = st.give_back(slot);
    if let Some((_, size)) = &released {
        // Under the lock: once it is released, another thread may free an orphaned arena.
        a.shared.total_bytes.fetch_sub(*size, Ordering::Relaxed);
    }
    let last_of_orphan = st.orphaned && st.n_lent == 0;
    drop(st);
    // The raw free (a driver call) runs outside the lock; the block is owned, not the arena's.
    drop(released);
    if last_of_orphan {
        // SAFETY: the pool's `Drop` called `keep_alive` for this orphaned arena, and this was its
        // last lent chunk, so this is the one matching release; `arena` is not used again.
        unsafe { arena.release_kept() };
    }
}

impl<B: Backend> Drop for PooledMemory<B> {
    fn drop(&mut self) {
        if let Some(arena) = self.arena.take() {
            if hooks::active() {
                // A hook's error cannot be reported from `drop`; `free()` reports it.
                let _ = self.free_hooked(arena);
            } else {
                give_back(arena, self.slot);
            }
        }
    }
}

impl<B: Backend> fmt::Debug for PooledMemory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<PooledMemory 0x{:x} size={} device={}>", self.ptr, self.size, self.device)
    }
}

#[cfg(test)]
mod tests;
