//! The multi-device pool: CuPy's `MemoryPool`, one [`SingleDeviceMemoryPool`] per device.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::hal::DeviceId;
use crate::pool::{GrowthPolicy, Limit, MemoryStats, PoolStats, PooledMemory, RawAllocator};
use crate::runtime::memory::BaseMemory;
use crate::runtime::pointer::Allocator;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::state::{current_device, device_count};
use crate::runtime::stream::Stream;
use crate::runtime::stream::StreamRuntime;

use super::{DeviceAllocator, SingleDeviceMemoryPool};

/// One lazily made pool per device.
type DevicePools<B, A> = Box<[OnceLock<SingleDeviceMemoryPool<B, A>>]>;

/// One pool per device; every call goes to the current device's pool (CuPy's `MemoryPool`).
///
/// Each device's pool is created on first use, with its own device id and its own
/// `GPUMEM_GPU_MEMORY_LIMIT` fraction. CuPy 14 creates them all at once while one device is
/// current, so every pool reports that device's id to hooks; gpumem does not copy that.
pub struct MemoryPool<B: StreamRuntime, A: RawAllocator + Clone = DeviceAllocator<B>> {
    allocator: A,
    pools: OnceLock<DevicePools<B, A>>,
    /// The growth policy of every device's pool, set with [`MemoryPool::set_growth_policy`].
    policy: parking_lot::Mutex<GrowthPolicy>,
}

impl<B: StreamRuntime, A: RawAllocator + Clone> fmt::Debug for MemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pools: Vec<_> =
            self.pools.get().map(|p| p.iter().filter_map(OnceLock::get).collect()).unwrap_or_default();
        f.debug_struct("MemoryPool").field("pools", &pools).finish()
    }
}

impl<B: StreamRuntime> Default for MemoryPool<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: StreamRuntime> MemoryPool<B> {
    /// A pool on the runtime's allocator, with CuPy's rule (`GrowthPolicy::CacheUntilOutOfMemory`)
    /// and fixed blocks, for parity with CuPy.
    ///
    /// Which policy to pick: to hold the least memory, `GrowthPolicy::Segments` with expandable
    /// segments (`GPUMEM_EXPANDABLE_SEGMENTS=1`, or [`SingleDeviceMemoryPool::with_expandable_segments`]
    /// and [`MemoryPool::set_growth_policy`]). CuPy's rule keeps a block for every request size it
    /// has seen, which is cheap on a loop of fixed shapes but holds many times what is in use on
    /// work whose sizes vary (GPT-2 `generate()` over varied lengths: 8.3 times, against 1.04 for
    /// `Segments` with expandable segments, measured through the C ABI). The C ABI's default is
    /// `Segments` with expandable segments for that reason; `gpumem-trace recommend` names the best
    /// policy for a recorded trace.
    #[must_use]
    pub fn new() -> Self {
        Self::with_allocator(DeviceAllocator::new())
    }
}

impl<B: StreamRuntime, A: RawAllocator + Clone> MemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    /// A pool on the given raw allocator (CuPy's `MemoryPool(allocator)`); each device's pool
    /// gets a clone of it.
    #[must_use]
    pub fn with_allocator(allocator: A) -> Self {
        MemoryPool {
            allocator,
            pools: OnceLock::new(),
            policy: parking_lot::Mutex::new(GrowthPolicy::default()),
        }
    }

    /// The pool of `device`, created on first use.
    ///
    /// # Errors
    ///
    /// `NoSuchDevice` for a device that does not exist; the pool's creation errors (see
    /// [`SingleDeviceMemoryPool::new`]); `DriverNotFound` / `NoDevice`.
    pub fn device_pool(&self, device: DeviceId) -> Result<&SingleDeviceMemoryPool<B, A>> {
        let pools = match self.pools.get() {
            Some(p) => p,
            None => {
                let n = device_count::<B>()?;
                self.pools.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect())
            }
        };
        let slot = usize::try_from(device).ok().and_then(|i| pools.get(i)).ok_or(Error::NoSuchDevice {
            device,
            count: pools.len(),
            backend: B::NAME,
        })?;
        if let Some(pool) = slot.get() {
            return Ok(pool);
        }
        let pool = SingleDeviceMemoryPool::with_allocator(device, self.allocator.for_device(device)?)?;
        let policy = self.policy.lock();
        pool.set_growth_policy(*policy);
        // Two threads may race to create it; the loser's empty pool is dropped.
        Ok(slot.get_or_init(|| pool))
    }

    /// The current device's pool.
    ///
    /// # Errors
    ///
    /// As [`MemoryPool::device_pool`].
    #[inline]
    pub fn current_pool(&self) -> Result<&SingleDeviceMemoryPool<B, A>> {
        let dev = current_device::<B>();
        if let Some(pool) =
            self.pools.get().and_then(|p| p.get(usize::try_from(dev).ok()?)).and_then(OnceLock::get)
        {
            return Ok(pool);
        }
        self.device_pool(dev)
    }

    /// Allocates `size` bytes on the current device (see [`SingleDeviceMemoryPool::malloc`]).
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::malloc`].
    #[inline]
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        self.current_pool()?.malloc(size)
    }

    /// Allocates `size` bytes on the current device and returns the chunk itself (see
    /// [`SingleDeviceMemoryPool::malloc_pooled`]).
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::malloc`].
    #[inline]
    pub fn malloc_pooled(&self, size: usize) -> Result<PooledMemory<A>> {
        self.current_pool()?.malloc_pooled(size)
    }

    /// Releases the current device's cached whole blocks (see
    /// [`SingleDeviceMemoryPool::free_all_blocks`]). Does nothing before the first allocation.
    pub fn free_all_blocks(&self, stream: Option<&Stream<B>>) {
        if let Some(pool) = self.existing_current() {
            pool.free_all_blocks(stream);
        }
    }

    /// Marks the end of an iteration on `device`'s pool (see [`SingleDeviceMemoryPool::step`]).
    ///
    /// # Errors
    ///
    /// A device that does not exist; then as [`SingleDeviceMemoryPool::step`].
    pub fn step(&self, device: DeviceId) -> Result<()> {
        self.device_pool(device)?.step()
    }

    /// CuPy's deprecated alias of [`free_all_blocks`](Self::free_all_blocks).
    #[deprecated(note = "free_all_free is deprecated. Use free_all_blocks instead.")]
    pub fn free_all_free(&self) {
        self.free_all_blocks(None);
    }

    fn existing_current(&self) -> Option<&SingleDeviceMemoryPool<B, A>> {
        let dev = usize::try_from(current_device::<B>()).ok()?;
        self.pools.get()?.get(dev)?.get()
    }

    /// Bytes lent out on the current device.
    #[must_use]
    pub fn used_bytes(&self) -> usize {
        self.existing_current().map_or(0, SingleDeviceMemoryPool::used_bytes)
    }

    /// Bytes cached and free on the current device.
    #[must_use]
    pub fn free_bytes(&self) -> usize {
        self.existing_current().map_or(0, SingleDeviceMemoryPool::free_bytes)
    }

    /// Bytes held from the current device.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.existing_current().map_or(0, SingleDeviceMemoryPool::total_bytes)
    }

    /// The statistics of the current device's pool (see [`SingleDeviceMemoryPool::stats`]);
    /// zeros before its first allocation, so a loop reads them without a case for "not yet".
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        match self.existing_current() {
            Some(p) => p.stats(),
            None => PoolStats {
                device: current_device::<B>(),
                all: MemoryStats::default(),
                peaks_exact: true,
                arenas: Vec::new(),
            },
        }
    }

    /// Resets the peaks of the current device's pool.
    pub fn reset_peak(&self) {
        if let Some(p) = self.existing_current() {
            p.reset_peak();
        }
    }

    /// The current device's pool as a table; a table of zeros before its first allocation.
    #[must_use]
    pub fn memory_summary(&self) -> String {
        self.stats().to_string()
    }

    /// Free chunks on the current device.
    #[must_use]
    pub fn n_free_blocks(&self) -> usize {
        self.existing_current().map_or(0, SingleDeviceMemoryPool::n_free_blocks)
    }

    /// Sets the current device's limit (see [`SingleDeviceMemoryPool::set_limit`]); it
    /// overrides `GPUMEM_GPU_MEMORY_LIMIT` for that device only.
    ///
    /// # Errors
    ///
    /// As [`SingleDeviceMemoryPool::set_limit`], and [`MemoryPool::device_pool`].
    pub fn set_limit(&self, limit: Limit) -> Result<()> {
        self.current_pool()?.set_limit(limit)
    }

    /// Sets the growth policy of every device's pool, those already made and those made later
    /// (see [`SingleDeviceMemoryPool::set_growth_policy`]).
    pub fn set_growth_policy(&self, policy: GrowthPolicy) {
        let mut current = self.policy.lock();
        *current = policy;
        for pool in self.pools.get().into_iter().flat_map(|p| p.iter()).filter_map(OnceLock::get) {
            pool.set_growth_policy(policy);
        }
    }

    /// The growth policy set with [`MemoryPool::set_growth_policy`] (CuPy's rule by default).
    #[must_use]
    pub fn growth_policy(&self) -> GrowthPolicy {
        *self.policy.lock()
    }

    /// The current device's limit in bytes; 0 when unlimited.
    ///
    /// # Errors
    ///
    /// As [`MemoryPool::device_pool`].
    pub fn get_limit(&self) -> Result<usize> {
        self.current_pool()?.get_limit()
    }
}

impl<B: StreamRuntime, A: RawAllocator + Clone> Allocator<B> for MemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        MemoryPool::malloc(self, size)
    }
}

impl<B: StreamRuntime, A: RawAllocator> Allocator<B> for SingleDeviceMemoryPool<B, A>
where
    A::Block: BaseMemory<B>,
{
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        SingleDeviceMemoryPool::malloc(self, size)
    }
}
