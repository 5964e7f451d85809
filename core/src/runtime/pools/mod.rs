//! The typed pools: CuPy's `SingleDeviceMemoryPool` and `MemoryPool`, the pool data structure of
//! [`crate::pool`] with the runtime's allocator, pointers, the current stream's arena and limits
//! in the user's terms.

pub mod async_pool;
mod multi;
mod share;
#[cfg(test)]
mod tests;

use std::fmt;
use std::marker::PhantomData;

use crate::error::Error;
use crate::error::Result;
use crate::hal::{DeviceId, DevicePtr};
use crate::pool::{
    ArenaCache, ArenaKey, GrowthPolicy, Limit, Pool, PoolSnapshot, PoolStats, PooledMemory, RawAllocator,
};
use crate::runtime::memory::{BaseMemory, Memory};
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::stream::Stream;
use crate::runtime::stream::StreamRuntime;

pub use crate::runtime::device_allocator::{DeviceAllocator, DeviceBlock};
pub use async_pool::{malloc_async, MemoryAsync, MemoryAsyncPool};
pub use multi::MemoryPool;
pub use share::EventStreamOrder;

/// A raw allocator made of a function returning boxed memory objects, for allocators whose
/// blocks are of several kinds. Each block costs a box; [`RawAllocator`] with a block type of its
/// own does not.
pub struct FnAllocator<F>(pub F);

impl<B: StreamRuntime, F> RawAllocator for FnAllocator<F>
where
    F: Fn(DeviceId, usize) -> Result<Box<dyn BaseMemory<B>>> + Send + Sync + 'static,
{
    type Block = Box<dyn BaseMemory<B>>;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        (self.0)(device, size)
    }
}

/// A pool for one device: CuPy's `SingleDeviceMemoryPool`. See [`crate::pool`] for its rules.
///
/// `A` is the raw allocator, the device's own by default. Its blocks must be device memory of
/// `B` ([`BaseMemory<B>`]), which is what lets the pool's chunks become [`MemoryPointer`]s.
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
pub struct SingleDeviceMemoryPool<B: StreamRuntime, A: RawAllocator = DeviceAllocator<B>> {
    pool: Pool<A>,
    /// A malformed `GPUMEM_GPU_MEMORY_LIMIT`: every allocation reports it until
    /// [`SingleDeviceMemoryPool::set_limit`] overrides the variable.
    limit_env_error: LimitEnvError,
    _backend: PhantomData<fn() -> B>,
}

/// The error of a malformed limit variable, kept by the pool it was meant for.
#[derive(Default)]
struct LimitEnvError {
    /// Whether `error` holds one: the allocation paths check this alone.
    pending: std::sync::atomic::AtomicBool,
    error: parking_lot::Mutex<Option<Error>>,
}

impl LimitEnvError {
    fn set(&self, error: Error) {
        *self.error.lock() = Some(error);
        self.pending.store(true, std::sync::atomic::Ordering::Release);
    }

    fn clear(&self) {
        self.pending.store(false, std::sync::atomic::Ordering::Release);
        *self.error.lock() = None;
    }

    /// `Err` with the kept error, if any. A pool with one never lends memory, so every
    /// allocation reaches the paths that call this.
    #[inline]
    fn check(&self) -> Result<()> {
        if !self.pending.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        self.error.lock().clone().map_or(Ok(()), Err)
    }
}

impl<B: StreamRuntime, A: RawAllocator> fmt::Debug for SingleDeviceMemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleDeviceMemoryPool")
            .field("device", &self.pool.device_id())
            .field("used_bytes", &self.used_bytes())
            .field("total_bytes", &self.total_bytes())
            .field("limit", &self.pool.get_limit())
            .finish_non_exhaustive()
    }
}

impl<B: StreamRuntime> SingleDeviceMemoryPool<B> {
    /// A pool for `device` on the runtime's allocator, limited by `GPUMEM_GPU_MEMORY_LIMIT` if it
    /// is set, with expandable segments when `GPUMEM_EXPANDABLE_SEGMENTS` is `1` or `true`
    /// (PyTorch's `expandable_segments:True`: blocks grow in place on the virtual-memory API).
    ///
    /// # Errors
    ///
    /// `InvalidEnvironment` when a variable cannot be parsed (a malformed
    /// `GPUMEM_GPU_MEMORY_LIMIT` is not reported here but by every allocation until
    /// [`SingleDeviceMemoryPool::set_limit`] overrides it); `Unsupported` for expandable
    /// segments on a backend without virtual memory (`B::CAPS.virtual_memory`); the runtime's
    /// error when a fraction needs the device's memory size.
    pub fn new(device: DeviceId) -> Result<Self> {
        Self::with_allocator(device, DeviceAllocator::new().for_device(device)?)
    }

    /// A pool for `device` with expandable segments, whatever the environment says.
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::new`].
    pub fn with_expandable_segments(device: DeviceId) -> Result<Self> {
        Self::with_allocator(device, DeviceAllocator::expandable(device)?)
    }

    /// A pool for `device` with expandable segments that stitch: on a miss that would grow a
    /// block, the pages under its free chunks move to where the request goes
    /// ([`DeviceAllocator::stitching`]; the pool guide's "Stitching" says what it costs).
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::with_expandable_segments`].
    pub fn with_stitching(device: DeviceId) -> Result<Self> {
        Self::with_allocator(device, DeviceAllocator::stitching(device)?)
    }
}

impl<B: StreamRuntime, A: RawAllocator> SingleDeviceMemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    /// A pool for `device` on the given raw allocator, limited by `GPUMEM_GPU_MEMORY_LIMIT` if it
    /// is set; with expandable segments on when the allocator grows blocks
    /// ([`RawAllocator::expandable`]).
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::new`].
    pub fn with_allocator(device: DeviceId, allocator: A) -> Result<Self> {
        crate::runtime::state::per_thread_default_stream_checked()?;
        let pool = SingleDeviceMemoryPool {
            pool: Pool::new(device, allocator),
            limit_env_error: LimitEnvError::default(),
            _backend: PhantomData,
        };
        // Memory that queued work kept alive goes back once that work is done: looked at before
        // the pool grows, and waited for before it gives up.
        pool.pool.set_reclaimer(Box::new(|wait| {
            if wait {
                crate::runtime::stream::inflight::wait_all::<B>();
            } else {
                crate::runtime::stream::inflight::collect::<B>();
            }
        }));
        // Lending across streams orders the streams with events; off unless asked for.
        pool.pool.set_stream_order(Box::new(EventStreamOrder::<B>::new(device)));
        // A malformed limit does not stop the pool from being made: its `set_limit` may override
        // it. Until then, every allocation reports it.
        match Limit::from_env() {
            Ok(Some(limit)) => pool.set_limit(limit)?,
            Ok(None) => {}
            Err(e) => pool.limit_env_error.set(e),
        }
        if pool.pool.allocator().expandable() {
            pool.pool.set_expandable_segments(true)?;
        }
        if crate::pool::share_across_streams_from_env()? == Some(true) {
            pool.pool.set_share_across_streams(true)?;
        }
        if crate::pool::plan_automatically_from_env()? == Some(true) {
            pool.pool.plan_automatically();
        }
        Ok(pool)
    }

    /// Lends free memory of one stream's arena to allocations on another stream when their own
    /// arena has none that fits, before the pool asks the device for more (off by default, and
    /// with `GPUMEM_SHARE_ACROSS_STREAMS=0`; on with `GPUMEM_SHARE_ACROSS_STREAMS=1`). gpumem
    /// differs from CuPy here when on: CuPy never lends one stream's memory to another. The
    /// streams are ordered with events, so no safe program sees a race and a kernel of the
    /// program's own that used the memory on its old stream before the free is waited for too:
    /// the borrowing stream waits (on the device) for the work queued on the owner's stream so
    /// far, and the memory goes back to the owner's arena behind an event on the borrower's.
    /// Streams gpumem owns and the null and legacy default streams take part; per-thread default
    /// streams and foreign streams do not, and nothing is lent across streams inside a host
    /// function or while a stream captures ([`EventStreamOrder`]).
    pub fn set_share_across_streams(&self, on: bool) {
        // The order is installed above, so turning it on cannot fail.
        let _ = self.pool.set_share_across_streams(on);
    }

    /// The pool data structure underneath.
    #[must_use]
    pub fn pool(&self) -> &Pool<A> {
        &self.pool
    }

    /// The device this pool allocates on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.pool.device_id()
    }

    /// Allocates `size` bytes from the current stream's arena and returns a [`MemoryPointer`] to
    /// them (CuPy's `malloc`). Size 0 gives a pointer to an empty, unpooled [`Memory`], as in
    /// CuPy.
    ///
    /// # Errors
    ///
    /// `LimitExceeded` or `OutOfMemory` (CuPy's messages) once the retries are exhausted; a
    /// hook's error; the raw allocator's other errors.
    #[inline]
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        if crate::runtime::stream::inflight::any_capture::<B>() {
            if let Some(p) = self.reuse_in_capture(size) {
                return Ok(p);
            }
        }
        // The cache hit as in `malloc_pooled`: a chunk, not a `Result`, out of the thread-local
        // access, made into the pointer here. Written out in both: through a shared helper the
        // compiler moves the chunk once more (18 instructions on the hit, 42 on this one).
        let hit = B::stream_thread().try_with(|ts| self.pool.try_hit(size, ts.arena_key(), &ts.arenas));
        if let Ok(Some(pooled)) = hit {
            return Ok(MemoryPointer::from_pooled(pooled));
        }
        self.malloc_slow(size)
    }

    /// Everything but the cache hit (see [`Pool::malloc`]).
    #[inline(never)]
    fn malloc_slow(&self, size: usize) -> Result<MemoryPointer<B>> {
        let pooled = self.malloc_pooled_slow(size)?;
        if !pooled.is_chunk() {
            return self.empty_pointer();
        }
        Ok(MemoryPointer::from_pooled(pooled))
    }

    /// While the current stream captures: memory of this pool that the capture touched and then
    /// dropped, lent again within the capture (see the [crate docs](crate#graph-owned-memory)).
    /// It does not pass through the pool, so the memory hooks and the statistics do not see it.
    #[cold]
    fn reuse_in_capture(&self, size: usize) -> Option<MemoryPointer<B>> {
        let rounded = crate::pool::round_size(size).filter(|&n| n > 0)?;
        let target = crate::runtime::stream::target::<B>(None);
        crate::runtime::stream::inflight::reuse_in_capture::<B>(
            &target,
            self.device_id(),
            self.pool.uid(),
            rounded,
        )
        .map(MemoryPointer::from_arc)
    }

    #[cold]
    fn empty_pointer(&self) -> Result<MemoryPointer<B>> {
        Ok(MemoryPointer::from_memory(Memory::<B>::new_on(self.device_id(), 0)?))
    }

    /// Allocates `size` bytes and returns the chunk itself, which goes back to the pool when
    /// dropped. This is the pool's fastest path: no reference-counted pointer is made.
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::malloc`].
    #[inline]
    pub fn malloc_pooled(&self, size: usize) -> Result<PooledMemory<A>> {
        // The cache hit returns a chunk alone, not a `Result`: an error is many words larger than
        // a chunk, and moving one through the thread-local access cost the hit a tenth of its
        // instructions.
        // Hooks are checked before the thread-local access, not inside it as `try_hit` would:
        // a hooked allocation then makes that access once, in `malloc_pooled_hooked`.
        if crate::hooks::active() {
            return self.malloc_pooled_hooked(size);
        }
        let hit =
            B::stream_thread().try_with(|ts| self.pool.try_hit_unhooked(size, ts.arena_key(), &ts.arenas));
        match hit {
            Ok(Some(p)) => Ok(p),
            _ => self.malloc_pooled_slow(size),
        }
    }

    /// [`SingleDeviceMemoryPool::malloc_pooled`] with hooks installed on this thread: the hit is
    /// tried between the hooks. The error comes out of the thread-local access boxed, so that
    /// the chunk is all that moves on a hit.
    #[inline(never)]
    fn malloc_pooled_hooked(&self, size: usize) -> Result<PooledMemory<A>> {
        self.limit_env_error.check()?;
        let result =
            B::stream_thread().try_with(|ts| self.pool.malloc_hooked(size, ts.arena_key(), &ts.arenas));
        match result {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => self.malloc_at_thread_exit(size),
        }
    }

    /// Everything but the cache hit (see [`Pool::malloc`]).
    #[inline(never)]
    fn malloc_pooled_slow(&self, size: usize) -> Result<PooledMemory<A>> {
        self.limit_env_error.check()?;
        if crate::hooks::active() {
            // The hit was not tried (`malloc` tries it only without hooks).
            return self.malloc_pooled_hooked(size);
        }
        let result =
            B::stream_thread().try_with(|ts| self.pool.malloc_after_try(size, ts.arena_key(), &ts.arenas));
        match result {
            Ok(result) => result,
            Err(_) => self.malloc_at_thread_exit(size),
        }
    }

    /// An allocation while this thread's state is being torn down: the default stream's arena,
    /// without the thread's cache.
    #[cold]
    fn malloc_at_thread_exit(&self, size: usize) -> Result<PooledMemory<A>> {
        self.pool.malloc(size, crate::runtime::state::default_arena_key(), &ArenaCache::new())
    }

    /// Releases the free chunks that are whole raw blocks, in every arena (`None`) or in the
    /// arena of `stream` (CuPy's `free_all_blocks(stream=None)`). Work queued on a chunk's own
    /// stream keeps nothing alive (the pool lends the chunk again only to that stream), so each
    /// block first waits for such work (see [`DeviceBlock`]): a host function
    /// that waits for the calling thread would hold this call, as it holds `cuMemFree`.
    pub fn free_all_blocks(&self, stream: Option<&Stream<B>>) {
        self.pool.free_all_blocks(stream.map(Stream::arena_key));
    }

    /// Marks the end of an iteration of the loop that allocates from this pool: the first call
    /// turns planning on ([`Pool::step`]). Measure before keeping it: on live PyTorch programs
    /// the plan has not yet held less than the pool without one (BENCHMARKS.md).
    ///
    /// # Errors
    ///
    /// As [`Pool::step`].
    pub fn step(&self) -> Result<()> {
        self.pool.step()
    }

    /// Drops the loop's plan and turns planning off ([`Pool::reset_planning`]).
    pub fn reset_planning(&self) {
        self.pool.reset_planning();
    }

    /// CuPy's deprecated alias of [`free_all_blocks`](Self::free_all_blocks).
    #[deprecated(note = "free_all_free is deprecated. Use free_all_blocks instead.")]
    pub fn free_all_free(&self) {
        self.free_all_blocks(None);
    }

    /// Bytes lent out (rounded sizes).
    #[must_use]
    pub fn used_bytes(&self) -> usize {
        self.pool.used_bytes()
    }

    /// Bytes cached and free: `total_bytes() - used_bytes()`, as CuPy 14.1+.
    #[must_use]
    pub fn free_bytes(&self) -> usize {
        self.pool.free_bytes()
    }

    /// Bytes held from the raw allocator.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.pool.total_bytes()
    }

    /// The number of free chunks in all arenas (split remainders counted separately).
    #[must_use]
    pub fn n_free_blocks(&self) -> usize {
        self.pool.n_free_blocks()
    }

    /// Sets the limit on bytes held from the device (CuPy's `set_limit(size=..)` or
    /// `set_limit(fraction=..)`); `Limit::Bytes(0)` and `Limit::Fraction(0.0)` mean unlimited.
    /// It overrides `GPUMEM_GPU_MEMORY_LIMIT`, a malformed value too (whose error the pool's
    /// allocations report until then).
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
            Limit::Fraction(_) => limit.bytes(B::mem_get_info(self.device_id())?.total),
        };
        self.pool.set_limit(bytes);
        self.limit_env_error.clear();
        Ok(())
    }

    /// The limit in bytes; 0 when unlimited. Fallible as the other pools' `get_limit`
    /// ([`MemoryPool::get_limit`] may have to create the device's pool,
    /// [`MemoryAsyncPool::get_limit`] asks the runtime), so one call site serves them all; this
    /// pool's never fails.
    ///
    /// # Errors
    ///
    /// `InvalidEnvironment` while a malformed `GPUMEM_GPU_MEMORY_LIMIT` is not overridden by
    /// [`SingleDeviceMemoryPool::set_limit`].
    pub fn get_limit(&self) -> Result<usize> {
        self.limit_env_error.check()?;
        Ok(self.pool.get_limit())
    }

    /// Sets how the pool grows (CuPy's rule by default).
    pub fn set_growth_policy(&self, policy: GrowthPolicy) {
        self.pool.set_growth_policy(policy);
    }

    /// How the pool grows.
    #[must_use]
    pub fn growth_policy(&self) -> GrowthPolicy {
        self.pool.growth_policy()
    }

    /// The pool's statistics and each stream's, as PyTorch counts them (see
    /// [`crate::pool::stats`]): `torch.cuda.memory_stats`.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Sets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        self.pool.reset_peak();
    }

    /// Every segment with its chunks, their streams, sizes and states
    /// (`torch.cuda.memory_snapshot`).
    #[must_use]
    pub fn snapshot(&self) -> PoolSnapshot {
        self.pool.snapshot()
    }

    /// The statistics as a readable table (`torch.cuda.memory_summary`).
    #[must_use]
    pub fn memory_summary(&self) -> String {
        self.pool.memory_summary()
    }

    /// Adds an observer called with the error and the pool's snapshot before an out-of-memory
    /// error returns from an allocation (see [`Pool::add_oom_observer`]).
    pub fn add_oom_observer(&self, observer: impl Fn(&Error, &PoolSnapshot) + Send + Sync + 'static) {
        self.pool.add_oom_observer(observer);
    }

    /// Removes every out-of-memory observer.
    pub fn clear_oom_observers(&self) {
        self.pool.clear_oom_observers();
    }

    /// The free chunks of the current stream's arena as `(ptr, size)`, for debugging: the arena
    /// this thread allocates from (its lane of the stream, if it moved to one).
    #[must_use]
    pub fn free_chunks_of_current_stream(&self) -> Vec<(DevicePtr, usize)> {
        B::stream_thread()
            .try_with(|ts| self.pool.free_chunks_seen_by(ts.arena_key(), &ts.arenas))
            .unwrap_or_else(|_| self.pool.free_chunks(ArenaKey::NULL))
    }
}
