//! The caching memory pool: CuPy's `SingleDeviceMemoryPool` and `MemoryPool`.
//!
//! # Rules (CuPy's, from `spec/cupy-behaviour.md` §1)
//!
//! - Sizes are rounded up to [`ALLOCATION_UNIT_SIZE`] (512 bytes); a cache miss asks the raw
//!   allocator for exactly the rounded size.
//! - Free chunks are kept per *arena*, one per stream: the current stream when `malloc` runs (the
//!   null stream's arena is shared by every thread using it; the per-thread default stream gives
//!   each thread its own). gpumem differs in one case: threads that allocate on one stream (the
//!   null stream, most often) at the same time and keep waiting for its arena's lock move to
//!   *lanes* of that stream, arenas of their own that pass whole free blocks between them
//!   (module `lanes`). A chunk goes back to the arena it came from, whatever stream is current
//!   when it is freed, so memory is only reused in the order of the stream it was allocated on.
//!   gpumem can do more, off by default: [`Pool::set_share_across_streams`] lends a free chunk of
//!   one arena to another stream's miss, with the two streams ordered (module `share`).
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
mod chunk;
pub mod counting;
#[allow(unsafe_code)] // the virtual-memory calls on the blocks it owns; see the module
pub mod expandable;
mod index;
mod key;
mod lanes;
mod limit;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod pinned;
mod policy;
mod raw;
mod share;
pub mod stats;
mod sync;
#[cfg(test)]
mod tests;
pub mod trace;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{BoxedError, Error, Result};
use crate::hal::types::{DeviceId, DevicePtr};
use crate::hooks::{self, AllocEvent, MallocEvent, Observed};

use arena::ArenaState;
pub use chunk::PooledMemory;
use chunk::{give_back, observe_raw_frees};
pub use key::ArenaKey;
pub use limit::{Limit, LIMIT_ENV};
pub use raw::{RawAllocator, RawBlock};
pub use share::{NoQueuedWork, StreamOrder};
pub use stats::{
    ArenaStats, BlockSnapshot, BlockState, MemoryStats, OomObserver, PoolSnapshot, PoolStats,
    SegmentSnapshot, Stat,
};
pub use sync::ArenaCache;
#[doc(hidden)]
pub use sync::ARENA_LOCK;
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
    /// not cut up for small requests (their remainders would pin them).
    ///
    /// It holds the least memory of the policies, and pays for it in raw calls: it never settles.
    /// Replaying three training steps of GPT-2 it allocated 1569 raw blocks and freed 706 (PyTorch:
    /// 170 and 0), and every step frees and allocates raw blocks again, each free a device-wide
    /// synchronisation (see BENCHMARKS.md). For a loop, [`GrowthPolicy::Segments`] is the choice.
    HoldPeakInUse,
    /// Size-classed segments that settle: a miss asks for a block of the request's class (2 MiB
    /// for requests up to 1 MiB, 20 MiB up to 10 MiB, larger ones rounded up to 2 MiB) and lends
    /// its head; small and large requests never share a plain block; nothing is released before the
    /// device runs out (or `free_all_blocks`). On a large miss, the arena's whole free large blocks
    /// are given back and fused into the new one (as large as all of them, or the request), so
    /// held memory grows by at most what the request lacks, and a training loop's transient
    /// blocks become a few large ones in its first step, cut up again by the later steps without
    /// a raw call. The cache hit costs the same as under the other policies.
    ///
    /// With expandable segments, small and large requests share one growing block, and a large
    /// request grows it by at least 20 MiB and at least 1/64 of what it maps: a loop's first
    /// step then maps memory a few times instead of once per new tensor (three driver calls a
    /// growth), a block of gigabytes grows in steps that keep pace with it, and a step grows past
    /// its need by less than one such growth per arena (at most 1/64 of the block, or 20 MiB).
    ///
    /// Without expandable segments, a long-lived tensor made while a large block is free (an
    /// optimizer's state, made after the first backward pass) is cut from that block and pins
    /// it, so the next step's large tensors need new memory (GPT-2's recorded steps: 1.08 held
    /// over in use). With them, the free tail of the growing block is lent last, so such a
    /// tensor goes into a hole that fits and the tail stays whole for the large tensors that
    /// grow it (1.003 on the same steps). What no rule here removes: the arenas of different
    /// streams share no memory (CuPy's rule), so a pool used from several streams holds at least
    /// the sum of each stream's own peak, unless [`Pool::set_share_across_streams`] lends free
    /// memory across them.
    Segments,
}

struct Shared<R: RawAllocator> {
    uid: u64,
    device: DeviceId,
    allocator: R,
    total_bytes: AtomicUsize,
    /// 0: unlimited.
    limit: AtomicUsize,
    /// `GrowthPolicy` as 0, 1, 2 or 3.
    policy: AtomicU8,
    /// The most bytes seen in use at once, sampled at misses (`HoldPeakInUse`).
    peak_in_use: AtomicUsize,
    /// Chunks released behind a fence that has not completed yet (see [`Fence`]).
    fenced: Mutex<Vec<Fenced<R>>>,
    /// Whether `fenced` may be non-empty: lets a miss skip the lock when nothing waits.
    any_fenced: AtomicBool,
    /// Whether an arena of a lane other than a stream's own was ever made (module `lanes`): lets
    /// a miss skip looking for other lanes in a pool that has none.
    any_lanes: AtomicBool,
    /// Releases memory that the layer above holds for queued work which may have finished
    /// (`false`), or waits for that work first (`true`); see [`Pool::set_reclaimer`].
    reclaimer: std::sync::OnceLock<Reclaimer>,
    /// Misses grow the arena's newest block in place (the allocator is expandable).
    expandable: AtomicBool,
    /// The most bytes held from the raw allocator at once since the last peak reset.
    peak_total: AtomicUsize,
    /// Allocations that failed for want of memory (the limit or the device).
    n_oom: AtomicU64,
    /// Allocations that went down the retry ladder (released the cache and tried again).
    n_retries: AtomicU64,
    /// Allocations served by another arena's free chunk (see `share`).
    n_lent_across: AtomicU64,
    /// The counters of arenas dropped from the pool (they had no memory left), so that the
    /// pool's totals do not go back when an arena goes.
    retired: Mutex<arena::Counters>,
    /// Arenas that existed since the last peak reset: with one, the pool's peaks are that
    /// arena's, exact; with several, a pool-wide peak is bounded by the sum of theirs.
    arenas_since_reset: AtomicUsize,
    /// Called with the pool's snapshot before an out-of-memory error returns.
    oom_observers: Mutex<Vec<Arc<OomObserver>>>,
    /// How two arenas' streams are ordered, for lending across streams (see `share`).
    stream_order: std::sync::OnceLock<Box<dyn StreamOrder>>,
    /// Whether a miss may take another arena's free chunk (see `share`).
    share: AtomicBool,
}

/// What [`Pool::set_reclaimer`] installs.
pub type Reclaimer = Box<dyn Fn(bool) + Send + Sync>;

/// The environment variable that turns expandable segments on for each new pool whose raw
/// allocator can grow blocks in place: `1` or `true` on, `0` or `false` off (PyTorch's
/// `expandable_segments:True`).
pub const EXPANDABLE_SEGMENTS_ENV: &str = "GPUMEM_EXPANDABLE_SEGMENTS";

/// Reads [`EXPANDABLE_SEGMENTS_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn expandable_segments_from_env() -> Result<Option<bool>> {
    flag_from_env(EXPANDABLE_SEGMENTS_ENV)
}

/// The environment variable that makes each new pool of the runtime lend free memory across
/// streams ([`Pool::set_share_across_streams`]): `1` or `true` on, `0` or `false` off (the
/// default, CuPy's rule).
pub const SHARE_ACROSS_STREAMS_ENV: &str = "GPUMEM_SHARE_ACROSS_STREAMS";

/// Reads [`SHARE_ACROSS_STREAMS_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn share_across_streams_from_env() -> Result<Option<bool>> {
    flag_from_env(SHARE_ACROSS_STREAMS_ENV)
}

/// An on/off environment variable: `1`, `true` or `True`; `0`, `false` or `False`.
fn flag_from_env(variable: &'static str) -> Result<Option<bool>> {
    let Ok(value) = std::env::var(variable) else { return Ok(None) };
    match value.trim() {
        "1" | "true" | "True" => Ok(Some(true)),
        "0" | "false" | "False" => Ok(Some(false)),
        _ => Err(Error::InvalidEnvironment { variable, value, expected: "1, true, 0 or false" }),
    }
}

/// A chunk waiting for its fence before it goes back to its arena.
struct Fenced<R: RawAllocator> {
    arena: ArenaRef<Arena<R>>,
    slot: u32,
    fence: Box<dyn Fence>,
}

/// Work queued on some stream that a released chunk must outlive: the pool lends the chunk again
/// only once [`Fence::is_complete`] says so (checked when an arena misses and before the pool
/// grows), or after [`Fence::wait`] (the out-of-memory ladder's last resort).
///
/// The runtime implements it with an event recorded on each stream that used the chunk.
pub trait Fence: Send + Sync + 'static {
    /// Whether the work the fence stands for is done. Must not block.
    fn is_complete(&self) -> bool;
    /// Blocks until the work is done.
    fn wait(&self);
}

/// One stream's share of a pool. Aligned to 128 bytes (two cache lines: x86's adjacent-line
/// prefetcher pulls lines in pairs) so that no other object shares a line with it: its lock and
/// counters are written on every allocation and free, by the threads on its stream, and arenas
/// made one after the other on one thread (a program that makes its streams up front) would
/// otherwise lie side by side in that thread's heap, each thread's writes taking the line from
/// the others.
#[repr(align(128))]
pub(crate) struct Arena<R: RawAllocator> {
    key: ArenaKey,
    uid: u32,
    /// The high bits of its chunks' `pmem_id`s (the arena's and the pool's numbers), made once so
    /// that a hooked allocation or free adds the slot alone (see `chunk::pmem_id_of`).
    pmem_base: u64,
    shared: Arc<Shared<R>>,
    state: ArenaLock<ArenaState<R::Block>>,
}

/// The pool for one device: CuPy's `SingleDeviceMemoryPool` rules, as a data structure. See the
/// [module docs](self).
///
/// It knows sizes, addresses, arena keys and fences; it calls nothing but its raw allocator and
/// the memory hooks. The caller names the arena of every allocation (the runtime passes the
/// current stream's) and lends it a per-thread [`ArenaCache`] for the hot path.
pub struct Pool<R: RawAllocator> {
    shared: Arc<Shared<R>>,
    arenas: Mutex<HashMap<ArenaKey, Arc<Arena<R>>>>,
    next_arena: AtomicU32,
}

impl<R: RawAllocator> fmt::Debug for Pool<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
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

impl<R: RawAllocator> Pool<R> {
    /// An empty, unlimited pool for `device` on `allocator`.
    pub fn new(device: DeviceId, allocator: R) -> Self {
        Pool {
            shared: Arc::new(Shared {
                uid: next_pool_uid(),
                device,
                allocator,
                total_bytes: AtomicUsize::new(0),
                limit: AtomicUsize::new(0),
                policy: AtomicU8::new(0),
                peak_in_use: AtomicUsize::new(0),
                fenced: Mutex::new(Vec::new()),
                any_fenced: AtomicBool::new(false),
                any_lanes: AtomicBool::new(false),
                reclaimer: std::sync::OnceLock::new(),
                expandable: AtomicBool::new(false),
                peak_total: AtomicUsize::new(0),
                n_oom: AtomicU64::new(0),
                n_retries: AtomicU64::new(0),
                n_lent_across: AtomicU64::new(0),
                retired: Mutex::new(arena::Counters::default()),
                arenas_since_reset: AtomicUsize::new(0),
                oom_observers: Mutex::new(Vec::new()),
                stream_order: std::sync::OnceLock::new(),
                share: AtomicBool::new(false),
            }),
            arenas: Mutex::new(HashMap::new()),
            next_arena: AtomicU32::new(1),
        }
    }

    /// The device this pool allocates on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.shared.device
    }

    /// A number that tells this pool from every other live pool (its chunks report the same
    /// number: [`PooledMemory::pool_uid`]).
    #[must_use]
    pub fn uid(&self) -> usize {
        Arc::as_ptr(&self.shared).addr()
    }

    /// Installs what the pool calls before it grows: `reclaim(false)` on a cache miss, to give
    /// back chunks held only by finished work; `reclaim(true)` on the out-of-memory ladder's last
    /// step, to wait for that work. The runtime releases the memory its queued operations kept.
    /// Installed once; later calls are ignored.
    pub fn set_reclaimer(&self, reclaim: Reclaimer) {
        let _ = self.shared.reclaimer.set(reclaim);
    }

    fn reclaim(&self, wait: bool) {
        if let Some(r) = self.shared.reclaimer.get() {
            r(wait);
        }
    }

    /// The raw allocator.
    #[must_use]
    pub fn allocator(&self) -> &R {
        &self.shared.allocator
    }

    /// Allocates `size` bytes from the arena `key` and returns the chunk, which goes back to the
    /// pool when dropped; fires the memory hooks when any is installed. Size 0 gives an empty
    /// chunk (address 0), as CuPy's zero-size `malloc`.
    ///
    /// # Errors
    ///
    /// `LimitExceeded` or `OutOfMemory` (CuPy's messages) once the retries are exhausted; a
    /// hook's error; [`Error::InvalidRawBlock`] when the raw allocator returns a block that does
    /// not hold the request; the raw allocator's other errors.
    #[inline]
    pub fn malloc(&self, size: usize, key: ArenaKey, cache: &ArenaCache) -> Result<PooledMemory<R>> {
        match self.try_hit(size, key, cache) {
            Some(p) => Ok(p),
            None => self.malloc_after_try(size, key, cache),
        }
    }

    /// The cache hit alone: a chunk of `size` bytes from arena `key`'s free index, when the arena
    /// is in `cache`, no hook is installed, and the size is neither zero nor too large to round.
    /// `None` for everything else, which [`Pool::malloc`] handles. It returns a chunk or nothing
    /// (no `Result`), so that the hit moves a chunk's few words and never an error's.
    #[inline(always)]
    pub fn try_hit(&self, size: usize, key: ArenaKey, cache: &ArenaCache) -> Option<PooledMemory<R>> {
        if hooks::active() {
            return None;
        }
        self.try_hit_unhooked(size, key, cache)
    }

    /// [`Pool::try_hit`] for a caller that has found no hook installed ([`hooks::active`]) on
    /// this thread: the runtime checks before its thread-local access, so that a hooked
    /// allocation goes to [`Pool::malloc_hooked`] without making that access twice.
    #[inline(always)]
    pub(crate) fn try_hit_unhooked(
        &self,
        size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Option<PooledMemory<R>> {
        let mem_size = round_size(size).filter(|&n| n > 0)?;
        self.take_cached(size, mem_size, key, cache)
    }

    /// A chunk of `mem_size` (`size` rounded, not zero) bytes from arena `key`'s free index, if
    /// `cache` holds the arena: no map lookup, no reference count.
    #[inline(always)]
    fn take_cached(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Option<PooledMemory<R>> {
        cache
            .with::<Arena<R>, _>(
                self.shared.uid,
                key,
                // Inlined by force: with the hit reached from several callers, the compiler
                // otherwise makes this closure a call of its own (43 instructions per pair).
                #[inline(always)]
                |arena| {
                    let (mut st, contended) = arena.get().state.lock_noting_contention();
                    if contended && cache.note_contention(st.counters.allocs) {
                        // The thread keeps waiting for this lock: the miss path moves it to a
                        // lane of its own (module `lanes`) and serves it there.
                        return None;
                    }
                    if st.retired {
                        return None;
                    }
                    let lent = st.take(mem_size, size)?;
                    drop(st);
                    Some(PooledMemory::lent(arena, lent, mem_size))
                },
            )
            .flatten()
    }

    /// [`Pool::malloc`] for a caller whose [`Pool::try_hit`] just returned `None`: everything
    /// but the cache hit (a size too large to round, zero, hooks, a miss), without trying the
    /// hit again.
    ///
    /// # Errors
    ///
    /// As [`Pool::malloc`].
    #[inline(never)]
    pub fn malloc_after_try(
        &self,
        size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Result<PooledMemory<R>> {
        if hooks::active() {
            return Ok(self.malloc_hooked(size, key, cache)?);
        }
        let mem_size = round_size(size).ok_or_else(|| Error::OutOfMemory { size, total: None })?;
        if mem_size == 0 {
            return Ok(PooledMemory::empty(self.shared.device));
        }
        // `try_hit` has looked in the cached arena already: straight to the miss.
        self.lend_slow(size, mem_size, key, cache, false)
    }

    /// [`Pool::malloc`] with hooks installed on the calling thread (the caller has checked
    /// [`hooks::active`]): a pool allocation between the malloc hooks. The cache hit is written
    /// out here, apart from the miss: on a hit the chunk goes straight into the returned `Ok`,
    /// and no `Result` of the lend (an [`Error`] is many words) is built and moved; the error
    /// comes boxed, for the same reason.
    ///
    /// # Errors
    ///
    /// As [`Pool::malloc`].
    #[inline(always)]
    pub(crate) fn malloc_hooked(
        &self,
        size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Result<PooledMemory<R>, BoxedError> {
        let mem_size = round_size(size).ok_or_else(|| Error::OutOfMemory { size, total: None })?;
        let pre = MallocEvent { device_id: self.shared.device, size, mem_size, mem_ptr: 0, pmem_id: 0 };
        hooks::fire(hooks::MALLOC_PREPROCESS, |h| h.malloc_preprocess(&pre))?;
        // A hooked allocation has not looked in the cached arena yet.
        let hit = if mem_size == 0 { None } else { self.take_cached(size, mem_size, key, cache) };
        let Some(p) = hit else { return self.malloc_hooked_miss(pre, key, cache) };
        let post = MallocEvent { mem_ptr: p.ptr(), pmem_id: p.pmem_id(), ..pre };
        hooks::observe_with(|| (Observed::Malloc(post), key.stream_key().raw()));
        // On a post-hook error the chunk is dropped here, so it goes back (firing the free hooks,
        // as in CuPy) and nothing leaks.
        hooks::fire(hooks::MALLOC_POSTPROCESS, |h| h.malloc_postprocess(&post))?;
        Ok(p)
    }

    /// [`Pool::malloc_hooked`] past its malloc pre-hooks when the cached arena had no chunk (or
    /// the size is 0): the miss path, then the post-hooks, also when the allocation failed.
    #[cold]
    #[inline(never)]
    fn malloc_hooked_miss(
        &self,
        pre: MallocEvent,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Result<PooledMemory<R>, BoxedError> {
        let result = if pre.mem_size == 0 {
            Ok(PooledMemory::empty(self.shared.device))
        } else {
            self.lend_slow(pre.size, pre.mem_size, key, cache, true)
        };
        let post = match &result {
            Ok(p) => MallocEvent { mem_ptr: p.ptr(), pmem_id: p.pmem_id(), ..pre },
            Err(_) => pre,
        };
        hooks::observe_with(|| (Observed::Malloc(post), key.stream_key().raw()));
        hooks::fire(hooks::MALLOC_POSTPROCESS, |h| h.malloc_postprocess(&post))?;
        Ok(result?)
    }

    #[cold]
    fn lend_slow(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
        hooked: bool,
    ) -> Result<PooledMemory<R>> {
        if cache.wants_lane() {
            self.move_to_lane(key, cache);
        }
        // Chunks whose fences have completed, or that finished work no longer holds, may serve
        // this request.
        self.reclaim(false);
        self.collect_fenced(false);
        let arena = self.arena(key, cache);
        {
            let mut st = arena.state.lock();
            if !st.retired {
                if let Some(lent) = st.take_with_tail(mem_size, size) {
                    drop(st);
                    return Ok(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size));
                }
            }
        }
        // The arena `key` names for this thread: another lane of its stream, if the thread moved
        // to one (module `lanes`).
        let lane = arena.key;
        drop(arena);
        if let Some(p) = self.take_over_from_lanes(size, mem_size, lane, key, cache) {
            return Ok(p);
        }
        if let Some(p) = self.borrow(size, mem_size, key) {
            return Ok(p);
        }
        if let Some(p) = self.grow_shared(size, mem_size, key, cache)? {
            return Ok(p);
        }
        match self.grow(size, mem_size, key, cache, hooked) {
            Err(e) if e.is_out_of_memory() || matches!(e, Error::LimitExceeded { .. }) => {
                if let Some(p) = self.lend_from_lanes(size, mem_size, lane) {
                    return Ok(p);
                }
                self.shared.n_oom.fetch_add(1, Ordering::Relaxed);
                self.notify_oom(&e);
                Err(e)
            }
            other => other,
        }
    }

    /// Calls the out-of-memory observers with the pool's snapshot (outside every lock, so an
    /// observer may read the pool's statistics or free memory).
    #[cold]
    fn notify_oom(&self, error: &Error) {
        let observers: Vec<Arc<OomObserver>> = self.shared.oom_observers.lock().clone();
        if observers.is_empty() {
            return;
        }
        let snapshot = self.snapshot();
        for observer in observers {
            observer(error, &snapshot);
        }
    }

    /// The arena `key`, from the thread's cache or the pool's map (a retired arena in the cache is
    /// replaced by the map's current one).
    fn arena(&self, key: ArenaKey, cache: &ArenaCache) -> Arc<Arena<R>> {
        let uid = self.shared.uid;
        if let Some(arena) = cache.get::<Arena<R>>(uid, key) {
            if !arena.state.lock().retired {
                return arena;
            }
        }
        let arena = self.arena_in_map(key);
        cache.put(uid, key, Arc::clone(&arena));
        arena
    }

    fn arena_in_map(&self, key: ArenaKey) -> Arc<Arena<R>> {
        let mut arenas = self.arenas.lock();
        Arc::clone(arenas.entry(key).or_insert_with(|| {
            if key.lane_number() != 0 {
                self.shared.any_lanes.store(true, Ordering::Relaxed);
            }
            let mut state = ArenaState::new();
            self.configure(&mut state);
            self.shared.arenas_since_reset.fetch_add(1, Ordering::Relaxed);
            let uid = self.next_arena.fetch_add(1, Ordering::Relaxed);
            Arc::new(Arena {
                key,
                uid,
                pmem_base: chunk::pmem_base(uid, self.shared.uid),
                shared: Arc::clone(&self.shared),
                state: ArenaLock::new(state),
            })
        }))
    }

    /// A cache miss: reserve against the limit, allocate a raw block (with the retry ladder) and
    /// lend all of it from arena `key`.
    #[cold]
    fn grow(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
        hooked: bool,
    ) -> Result<PooledMemory<R>> {
        // `HoldPeakInUse` releases whole blocks to stay at its peak; growing blocks in place works
        // against that (measured: it held 2.5 times what was in use), so it does not grow them.
        if self.shared.expandable.load(Ordering::Relaxed)
            && self.growth_policy() != GrowthPolicy::HoldPeakInUse
        {
            if let Some(p) = self.grow_in_place(size, mem_size, key, cache)? {
                return Ok(p);
            }
        }
        let mut block_len = mem_size;
        if self.shared.expandable.load(Ordering::Relaxed) {
            // The block maps whole granules: the pool counts and lends all of them.
            let granule = self.shared.allocator.granule().max(1);
            block_len = mem_size
                .checked_next_multiple_of(granule)
                .ok_or_else(|| Error::OutOfMemory { size: mem_size, total: None })?;
        }
        match self.growth_policy() {
            GrowthPolicy::CacheUntilOutOfMemory => {}
            GrowthPolicy::Segments => block_len = self.fuse_for(mem_size, key, cache)?,
            GrowthPolicy::ReleaseBeforeGrow => self.free_all_blocks(None),
            GrowthPolicy::HoldPeakInUse => {
                // Saturating: a request this large fails below, against the limit or the device.
                let in_use = self.used_bytes().saturating_add(mem_size);
                let peak = self.shared.peak_in_use.fetch_max(in_use, Ordering::Relaxed).max(in_use);
                let excess = self.total_bytes().saturating_add(mem_size).saturating_sub(peak);
                if excess > 0 {
                    self.release_cached(excess);
                }
            }
        }
        let block = match self.reserve_and_allocate(block_len, key, hooked) {
            // The rounded block does not fit where the request alone might: ask for that.
            Err(e)
                if block_len > mem_size
                    && (e.is_out_of_memory() || matches!(e, Error::LimitExceeded { .. })) =>
            {
                block_len = mem_size;
                self.reserve_and_allocate(mem_size, key, hooked)?
            }
            other => other?,
        };
        let mut block = Some(block);
        loop {
            let arena = self.arena(key, cache);
            let mut st = arena.state.lock();
            if st.retired {
                // Retired by a concurrent `free_all_blocks` since we looked: take the new one.
                continue;
            }
            let Some(block) = block.take() else { unreachable!("the block is lent once") };
            let lent = st.lend_new_block(block, block_len, mem_size, size);
            drop(st);
            return Ok(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size));
        }
    }

    /// Expandable segments: meets a miss by growing the arena's newest block at its end, by what
    /// its free tail lacks (rounded up to the allocator's granule). `None` when there is no such
    /// block, the growth would pass the limit, or the allocator cannot grow it: the caller then
    /// allocates a new block as usual. Growth fires no alloc hook (no raw block is allocated);
    /// the arena's lock is held across the allocator's call, so only this arena's stream waits.
    fn grow_in_place(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Result<Option<PooledMemory<R>>> {
        let arena = self.arena(key, cache);
        let mut st = arena.state.lock();
        if st.retired {
            return Ok(None);
        }
        let Some(tail) = st.growable_tail(mem_size) else { return Ok(None) };
        let granule = self.shared.allocator.granule().max(1);
        let Some(mut extra) = mem_size.saturating_sub(tail.free).checked_next_multiple_of(granule) else {
            return Ok(None);
        };
        if extra > 0 && self.growth_policy() == GrowthPolicy::Segments {
            extra = policy::growth(mem_size, extra, granule, tail.mapped);
        }
        if extra == 0 {
            // The tail fits after all (a fence completed, or another request's chunk came back).
            if let Some(lent) = st.take_with_tail(mem_size, size) {
                drop(st);
                return Ok(Some(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size)));
            }
            return Ok(None);
        }
        let limit = self.get_limit();
        let fits = self.shared.total_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
            total.checked_add(extra).filter(|&t| limit == 0 || t <= limit)
        });
        if fits.is_err() {
            return Ok(None);
        }
        let grown = match st.grow_tail(mem_size, extra, |block| self.shared.allocator.grow(block, extra)) {
            Ok(grown) => grown,
            Err(e) if e.is_out_of_memory() => false,
            Err(e) => {
                self.shared.total_bytes.fetch_sub(extra, Ordering::Relaxed);
                return Err(e);
            }
        };
        if !grown {
            self.shared.total_bytes.fetch_sub(extra, Ordering::Relaxed);
            return Ok(None);
        }
        self.shared.peak_total.fetch_max(self.total_bytes(), Ordering::Relaxed);
        // The grown tail holds the request, in the request's free index; best fit may still pick
        // a smaller free chunk that fits, which is as good.
        // `HoldPeakInUse`'s bound on splits does not apply: the tail was grown for this request.
        let bounded = std::mem::replace(&mut st.bounded_split, false);
        let lent = st.take_with_tail(mem_size, size);
        st.bounded_split = bounded;
        let Some(lent) = lent else { return Ok(None) };
        drop(st);
        Ok(Some(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size)))
    }

    /// Turns expandable segments on or off: with them, a miss grows the arena's newest raw block
    /// in place (more pages mapped at its end) instead of allocating a new one, and
    /// `free_all_blocks` unmaps the free tails of blocks. The free tail of the growing block is
    /// lent only when no other free chunk fits (dlmalloc's rule for its top chunk; PyTorch has no
    /// such rule): a request that fits a hole fills the hole, and the tail stays in one piece for
    /// a request that needs it grown. Off by default; the runtime's pools turn it on when their
    /// raw allocator grows blocks, which the runtime's device allocator does with
    /// [`EXPANDABLE_SEGMENTS_ENV`] set.
    ///
    /// # Errors
    ///
    /// `Unsupported` when turning it on and the raw allocator cannot grow blocks.
    pub fn set_expandable_segments(&self, on: bool) -> Result<()> {
        if on && !self.shared.allocator.expandable() {
            return Err(Error::Unsupported {
                operation: "expandable segments",
                backend: "this raw allocator",
            });
        }
        let map = self.arenas.lock();
        self.shared.expandable.store(on, Ordering::Relaxed);
        for arena in map.values() {
            self.configure(&mut arena.state.lock());
        }
        Ok(())
    }

    /// Whether expandable segments are on.
    #[must_use]
    pub fn expandable_segments(&self) -> bool {
        self.shared.expandable.load(Ordering::Relaxed)
    }

    /// `GrowthPolicy::Segments` on a miss of `mem_size` bytes in arena `key`: gives back the
    /// arena's whole free blocks of the request's class (large requests only) and returns the size
    /// of the block to ask for instead.
    fn fuse_for(&self, mem_size: usize, key: ArenaKey, cache: &ArenaCache) -> Result<usize> {
        let mut released = Vec::new();
        let mut fused = 0;
        if policy::class(mem_size, true) == 1 {
            let arena = self.arena(key, cache);
            let mut st = arena.state.lock();
            if !st.retired {
                fused = st.release_free_blocks_of(1, &mut released);
                self.shared.total_bytes.fetch_sub(fused, Ordering::Relaxed);
            }
            drop(st);
            self.observe_raw_frees(key, &released);
        }
        // The raw frees (driver calls) run after the lock is released.
        drop(released);
        let block = policy::block_size(mem_size, fused)
            .ok_or_else(|| Error::OutOfMemory { size: mem_size, total: None })?;
        Ok(block)
    }

    /// Reserves `size` bytes against the limit and allocates the raw block, undoing the
    /// reservation on every way out: an error, a hook's error or a hook's panic.
    fn reserve_and_allocate(&self, size: usize, key: ArenaKey, hooked: bool) -> Result<R::Block> {
        self.reserve(size)?;
        let reservation = Reservation { total: &self.shared.total_bytes, size };
        match self.allocate_raw(size, key, hooked) {
            Ok(block) => {
                std::mem::forget(reservation);
                self.shared.peak_total.fetch_max(self.total_bytes(), Ordering::Relaxed);
                Ok(block)
            }
            Err(Error::OutOfMemory { .. }) => {
                drop(reservation);
                Err(Error::OutOfMemory { size, total: Some(self.total_bytes()) })
            }
            Err(other) => Err(other),
        }
    }

    /// Reserves `size` bytes against the limit, releasing cached blocks (and waiting for fenced
    /// chunks) and retrying twice.
    fn reserve(&self, size: usize) -> Result<()> {
        let limit = self.get_limit();
        let exceeded = |pool: &Self| Error::LimitExceeded { size, total: pool.total_bytes(), limit };
        if limit != 0 && size > limit {
            return Err(exceeded(self));
        }
        for attempt in 0..3 {
            if attempt == 1 {
                self.shared.n_retries.fetch_add(1, Ordering::Relaxed);
            }
            if attempt > 0 {
                self.reclaim(attempt == 2);
                self.collect_fenced(attempt == 2);
                self.free_all_blocks(None);
            }
            let fits = self.shared.total_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                total.checked_add(size).filter(|&t| limit == 0 || t <= limit)
            });
            match fits {
                Ok(_) => return Ok(()),
                // No limit, and the sum itself overflows: no device has that much memory.
                Err(total) if limit == 0 => return Err(Error::OutOfMemory { size, total: Some(total) }),
                Err(_) => {}
            }
        }
        Err(exceeded(self))
    }

    /// Asks the raw allocator for `size` bytes: three attempts, releasing every arena's cached
    /// blocks before the second and the third (and waiting for fenced chunks before the third),
    /// with the alloc hooks around each. Every block is checked against the request.
    fn allocate_raw(&self, size: usize, key: ArenaKey, hooked: bool) -> Result<R::Block> {
        let device_id = self.shared.device;
        let mut attempt = 0;
        loop {
            let pre = AllocEvent { device_id, mem_size: size, mem_ptr: 0 };
            if hooked {
                hooks::fire(hooks::ALLOC_PREPROCESS, |h| h.alloc_preprocess(&pre))?;
            }
            let result = self
                .shared
                .allocator
                .allocate(device_id, size)
                .and_then(|block| raw::check_block(&block, device_id, size).map(|()| block));
            if hooked {
                let mem_ptr = result.as_ref().map_or(0, RawBlock::address);
                hooks::observe(Observed::Alloc(AllocEvent { mem_ptr, ..pre }), key.stream_key().raw());
                // On error the new block (if any) is dropped, i.e. freed: nothing leaks.
                hooks::fire(hooks::ALLOC_POSTPROCESS, |h| {
                    h.alloc_postprocess(&AllocEvent { mem_ptr, ..pre })
                })?;
            }
            match result {
                Err(e) if e.is_out_of_memory() && attempt < 2 => {
                    if attempt == 0 {
                        self.shared.n_retries.fetch_add(1, Ordering::Relaxed);
                    }
                    attempt += 1;
                    self.reclaim(attempt == 2);
                    self.collect_fenced(attempt == 2);
                    self.free_all_blocks(None);
                }
                other => return other,
            }
        }
    }

    /// Gives back the fenced chunks whose fences have completed; with `wait`, waits for every
    /// fence first.
    fn collect_fenced(&self, wait: bool) {
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
                let mut cut = 0;
                if self.shared.expandable.load(Ordering::Relaxed) {
                    let (allocator, granule) =
                        (&self.shared.allocator, self.shared.allocator.granule().max(1));
                    // A failed unmap keeps the tail: it stays cached and lendable.
                    cut =
                        st.shrink_tails(granule, |block, bytes| allocator.shrink(block, bytes).unwrap_or(0));
                }
                bytes = st.release_free_blocks(&mut released) + cut;
                empty = st.is_empty();
            }
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

    /// Releases cached whole blocks of any arena, largest first, until at least `bytes` are
    /// released or none is left.
    fn release_cached(&self, bytes: usize) {
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
    fn observe_raw_frees(&self, key: ArenaKey, blocks: &[R::Block]) {
        observe_raw_frees::<R>(self.shared.device, key, blocks);
    }

    fn sum_arenas(&self, f: impl Fn(&ArenaState<R::Block>) -> usize) -> usize {
        let arenas: Vec<Arc<Arena<R>>> = self.arenas.lock().values().cloned().collect();
        arenas.iter().map(|a| f(&a.state.lock())).sum()
    }

    /// Bytes lent out (rounded sizes), chunks waiting for a fence included.
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

    /// The number of chunks released behind a fence that has not been seen complete yet.
    #[must_use]
    pub fn n_fenced(&self) -> usize {
        self.shared.fenced.lock().len()
    }

    /// Sets the limit on bytes held from the device; 0 means unlimited.
    pub fn set_limit(&self, bytes: usize) {
        self.shared.limit.store(bytes, Ordering::Relaxed);
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
            self.configure(&mut arena.state.lock());
        }
    }

    /// Sets an arena's rules from the growth policy and expandable segments. Whether it keeps
    /// small and large requests apart changes only while it holds no block: its chunks keep the
    /// free index they were filed under, and a request looks in the index of the arena's
    /// setting, so changing it under live blocks would leave their free chunks unreachable.
    fn configure(&self, st: &mut ArenaState<R::Block>) {
        let policy = self.growth_policy();
        let expandable = self.shared.expandable.load(Ordering::Relaxed);
        st.bounded_split = policy == GrowthPolicy::HoldPeakInUse;
        // Small and large requests apart keep a small tensor from pinning a large block that
        // could be released; a growing block releases only its free tail, which any live chunk
        // before it pins, so with expandable segments all sizes share one growing block
        // (`policy`'s docs give what it measured).
        if st.holds_no_block() {
            st.segmented = policy == GrowthPolicy::Segments && !expandable;
        }
        // `HoldPeakInUse` does not grow blocks in place.
        st.set_keep_tail_last(expandable && policy != GrowthPolicy::HoldPeakInUse);
    }

    /// How the pool grows.
    #[must_use]
    pub fn growth_policy(&self) -> GrowthPolicy {
        match self.shared.policy.load(Ordering::Relaxed) {
            0 => GrowthPolicy::CacheUntilOutOfMemory,
            1 => GrowthPolicy::ReleaseBeforeGrow,
            2 => GrowthPolicy::HoldPeakInUse,
            _ => GrowthPolicy::Segments,
        }
    }

    /// The pool's statistics and each arena's (see [`stats`]). Takes each arena's lock in turn,
    /// so under concurrent allocation the arenas are read at slightly different moments.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
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

/// A reservation against the limit, undone when dropped (an error or a hook's panic between the
/// reservation and the block's arrival).
struct Reservation<'a> {
    total: &'a AtomicUsize,
    size: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.size, Ordering::Relaxed);
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
