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
//! # Where things are
//!
//! This file holds the pool's types and its hit path (`malloc`, `try_hit`, the miss's order of
//! resorts in `lend_slow`); a miss that must grow the pool is in `grow`, giving memory back in
//! `release`, and the read side (bytes, statistics, snapshots) in `inspect`. One arena's chunks
//! are in `arena`, a lent chunk and its way back in `chunk`. The plan learned from a loop that
//! calls [`Pool::step`] is in `planner`: while planning is on, every allocation takes the miss
//! path, which asks the planner first.
//!
//! The pool's logic is safe code; the two hot-path devices that need `unsafe` (the arena lock and
//! the uncounted arena pointer) are in the `sync` module, with the invariant that makes them sound.

#![allow(clippy::module_name_repetitions)]

mod arena;
mod chunk;
pub mod counting;
#[allow(unsafe_code)] // the virtual-memory calls on the blocks it owns; see the module
pub mod expandable;
mod grow;
mod index;
mod inspect;
mod key;
mod lanes;
mod limit;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod pinned;
mod planner;
mod policy;
mod raw;
mod release;
mod share;
pub mod stats;
mod stitch;
mod sync;
#[cfg(test)]
mod tests;
/// The benchmark traces and their replay, at the path code was written against: [`crate::trace`].
pub use crate::trace;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{BoxedError, Error, Result};
use crate::hal::types::DeviceId;
use crate::hooks::{self, MallocEvent, Observed};

use arena::ArenaState;
use chunk::{give_back, observe_raw_frees};
pub use chunk::{OtherStreams, PooledMemory};
pub use key::ArenaKey;
pub use limit::{Limit, LIMIT_ENV};
pub use planner::{PlanState, PlanStats};
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

/// `size` rounded up to the pool's unit, or the error for a size no allocation can have (past
/// [`MAX_ALLOCATION_SIZE`](crate::error::MAX_ALLOCATION_SIZE) once rounded).
pub(crate) fn round_allocation(size: usize) -> Result<usize> {
    round_size(size)
        .filter(|&n| n <= crate::error::MAX_ALLOCATION_SIZE)
        .ok_or_else(|| Error::size_too_large(size))
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
    /// request grows it by at least 20 MiB and at least 1/256 of what it maps: a block of tens of
    /// gigabytes grows in steps that keep pace with it (three driver calls a growth), and a step
    /// grows past its need by less than one such growth per arena (at most 1/256 of the block,
    /// or 20 MiB), which is held at the peak.
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
    /// The plan learned from the loop, once [`Pool::step`] is called (see `planner`).
    planner: planner::Planner,
}

/// What [`Pool::set_reclaimer`] installs.
pub type Reclaimer = Box<dyn Fn(bool) + Send + Sync>;

/// The environment variable that turns expandable segments on for each new pool whose raw
/// allocator can grow blocks in place: a flag, such as `1` or `true` on, `0` or `false` off
/// (PyTorch's `expandable_segments:True`; [the forms](crate::env)).
pub const EXPANDABLE_SEGMENTS_ENV: &str = "GPUMEM_EXPANDABLE_SEGMENTS";

/// Reads [`EXPANDABLE_SEGMENTS_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn expandable_segments_from_env() -> Result<Option<bool>> {
    flag_from_env(EXPANDABLE_SEGMENTS_ENV)
}

/// The environment variable that turns stitching on for each new pool of the runtime's device
/// allocator: expandable segments whose growths first take the pages under the pool's free
/// chunks, so a request that fits no hole is met by memory the pool holds
/// ([`ExpandableAllocator::stitching`](expandable::ExpandableAllocator::stitching)). A flag, such
/// as `1` or `true` on, `0` or `false` off (the default; [the forms](crate::env)); on, it implies
/// [`EXPANDABLE_SEGMENTS_ENV`], and `GPUMEM_EXPANDABLE_SEGMENTS=0` beside it is an error.
pub const STITCH_ENV: &str = "GPUMEM_STITCH";

/// Reads [`STITCH_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value, or when it is on and
/// [`EXPANDABLE_SEGMENTS_ENV`] is off.
pub fn stitch_from_env() -> Result<Option<bool>> {
    let stitch = flag_from_env(STITCH_ENV)?;
    if stitch == Some(true) && expandable_segments_from_env()? == Some(false) {
        return Err(Error::InvalidEnvironment {
            variable: STITCH_ENV,
            value: format!("1 with {EXPANDABLE_SEGMENTS_ENV}=0"),
            expected:
                "stitching moves the pages of growing blocks: leave GPUMEM_EXPANDABLE_SEGMENTS unset or on",
        });
    }
    Ok(stitch)
}

/// The environment variable that makes each new pool of the runtime lend free memory across
/// streams ([`Pool::set_share_across_streams`]): a flag, such as `1` or `true` on, `0` or
/// `false` off (the default, CuPy's rule; [the forms](crate::env)).
pub const SHARE_ACROSS_STREAMS_ENV: &str = "GPUMEM_SHARE_ACROSS_STREAMS";

/// Reads [`SHARE_ACROSS_STREAMS_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn share_across_streams_from_env() -> Result<Option<bool>> {
    flag_from_env(SHARE_ACROSS_STREAMS_ENV)
}

/// The environment variable that makes each new pool of the runtime plan its loop with no
/// `step()` calls ([`Pool::plan_automatically`]): a flag, such as `1` or `true` on, `0` or
/// `false` off (the default; [the forms](crate::env)).
pub const PLAN_AUTOMATICALLY_ENV: &str = "GPUMEM_PLAN_AUTOMATICALLY";

/// Reads [`PLAN_AUTOMATICALLY_ENV`]; `None` when it is not set.
///
/// # Errors
///
/// [`Error::InvalidEnvironment`] for any other value.
pub fn plan_automatically_from_env() -> Result<Option<bool>> {
    flag_from_env(PLAN_AUTOMATICALLY_ENV)
}

/// An on/off environment variable, read as [`crate::env::flag`] reads every flag.
fn flag_from_env(variable: &'static str) -> Result<Option<bool>> {
    crate::env::flag(variable)
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
                planner: planner::Planner::default(),
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
        if self.shared.planner.is_on() {
            // The planner sees every allocation (module `planner`): through the miss path.
            return None;
        }
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
        let mem_size = round_allocation(size)?;
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
        let mem_size = round_allocation(size)?;
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
        if self.shared.planner.is_on() {
            return self.lend_planned(size, mem_size, key, cache, hooked);
        }
        self.lend_pooled(size, mem_size, key, cache, hooked)
    }

    /// A miss served by the pool: the arena's free chunks and growing tail, other lanes, other
    /// arenas, then a new block.
    fn lend_pooled(
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
        // before it pins, so with expandable segments all sizes share one growing block. With
        // stitching the smallest are apart again: a small chunk in a large request's page keeps
        // that page from moving (`policy`'s docs give what each measured).
        if st.holds_no_block() {
            st.small_up_to = match (policy, expandable) {
                (GrowthPolicy::Segments, false) => policy::SMALL_REQUEST,
                (GrowthPolicy::Segments, true) if self.shared.allocator.stitches() => {
                    policy::STITCH_SMALL_REQUEST
                }
                _ => policy::ONE_CLASS,
            };
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
}
