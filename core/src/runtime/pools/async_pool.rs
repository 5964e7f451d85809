//! The runtime's stream-ordered allocator behind the typed API: CuPy's `MemoryAsync`,
//! `malloc_async` and `MemoryAsyncPool`.
//!
//! An allocation is made on a stream (`cuMemAllocAsync`) from the device's default memory pool,
//! which the runtime keeps; gpumem adds no cache of its own. Work gpumem queues on the memory on
//! another stream is ordered after the allocation (that stream waits for an event recorded behind
//! it), as for any other queued work on the same bytes. It comes back as the same
//! [`MemoryPointer`] every other allocator returns, so copies, memsets, typed buffers and the
//! stream-safety rules apply unchanged.
//!
//! # When the memory is freed
//!
//! [`MemoryAsync`] frees with `cuMemFreeAsync` on the stream it was allocated on, when its last
//! reference goes. Work gpumem queued on the memory (on any stream) holds a reference until the
//! stream has passed it, so the free is queued only after every such use is done or, for work
//! still queued, ordered after it: before the free is queued, the freeing stream waits for the
//! events of other streams' queued work on the same bytes, as every asynchronous operation does.
//! Memory reached only through raw addresses (a kernel of the program's own) is covered the
//! same way once it is kept with [`MemoryPointer::record_stream`]. A free that would land inside a
//! capture on that stream (where it would become part of the graph and run at every replay) is
//! held back and queued by a later allocation or [`MemoryAsyncPool::free_all_blocks`], once the
//! capture is over.
//!
//! CuPy's `MemoryAsync` keeps a weak reference to its stream and frees on the current stream
//! once the stream is gone. gpumem keeps the stream itself until the free: a destroyed stream's
//! handle may name a new stream, and a free must never be queued on a handle that is not live.
//!
//! # Limits and statistics
//!
//! As CuPy's, the limit is soft: it is the pool's release threshold
//! (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`), and [`MemoryAsyncPool::malloc`] refuses an allocation
//! that would take the pool's reserved bytes past it. The statistics are the pool's own
//! attributes, so memory other code of the process allocated from the same pool counts too.
//! Memory hooks are not called for these allocations (CuPy's `MemoryAsyncPool` does not support
//! hooks either).

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::hal::{AsyncPoolAttribute, CaptureStatus, DeviceId, DevicePtr};
use crate::pool::Limit;
use crate::runtime::memory::BaseMemory;
use crate::runtime::pointer::Allocator;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::state::{current_device, device_count, drop_outside_callbacks, record_drop_error};
use crate::runtime::stream::StreamRuntime;
use crate::runtime::stream::{self, inflight, Stream};

/// How many times an out-of-memory allocation is retried after synchronising the current stream
/// (CuPy's `MemoryAsyncPool.malloc`: twice).
const OOM_RETRIES: usize = 2;

/// Refuses the stream-ordered allocator on a backend without one.
fn check_supported<B: StreamRuntime>(operation: &'static str) -> Result<()> {
    if B::CAPS.stream_ordered_allocation {
        Ok(())
    } else {
        Err(Error::Unsupported { operation, backend: B::NAME })
    }
}

/// Device memory from the runtime's stream-ordered allocator: CuPy's `MemoryAsync`. It is freed
/// on its stream when dropped (see the [module docs](self)).
pub struct MemoryAsync<B: StreamRuntime> {
    ptr: DevicePtr,
    size: usize,
    device_id: DeviceId,
    /// The stream the memory was allocated on, which its free is queued on.
    stream: Stream<B>,
}

impl<B: StreamRuntime> MemoryAsync<B> {
    /// Allocates `size` bytes on the current device, ordered on `stream` (the current stream for
    /// `None`). A size of 0 allocates nothing and gives a null pointer, as CuPy's.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend or device without a stream-ordered allocator (CuPy: "Device
    /// {} does not support malloc_async"); `StreamDeviceMismatch` for a stream of another device;
    /// `OutOfMemory`; the runtime's error.
    pub fn new(size: usize, stream: Option<&Stream<B>>) -> Result<Self> {
        check_supported::<B>("malloc_async")?;
        let device_id = current_device::<B>();
        let stream = stream.cloned().unwrap_or_else(Stream::current);
        if let Some(stream_device) = stream.device_id() {
            if stream_device != device_id {
                return Err(Error::StreamDeviceMismatch { stream_device, current_device: device_id });
            }
        }
        retry_pending_frees();
        if size == 0 {
            return Ok(MemoryAsync { ptr: 0, size, device_id, stream });
        }
        let target = stream::target::<B>(Some(&stream));
        // SAFETY: `stream` is held by this function, so its handle is live for the call.
        let (queueing, _) = unsafe { inflight::begin(target, &[], || []) }?;
        // SAFETY: as above.
        let ptr = unsafe { B::malloc_async(device_id, size, stream.handle()) }?;
        let mem = MemoryAsync { ptr, size, device_id, stream };
        // The memory exists for work ordered after the allocation on its stream: recorded as a
        // queued operation on its bytes, so work gpumem queues on them on another stream waits
        // for the allocation first.
        queueing.keep([], &[(ptr, ptr.saturating_add(size))])?;
        Ok(mem)
    }

    /// The stream the memory was allocated on (and is freed on).
    #[must_use]
    pub fn stream(&self) -> &Stream<B> {
        &self.stream
    }
}

impl<B: StreamRuntime> fmt::Debug for MemoryAsync<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<MemoryAsync 0x{:x} size={} device={} stream={}>",
            self.ptr,
            self.size,
            self.device_id,
            self.stream.ptr()
        )
    }
}

// SAFETY: the range is one live stream-ordered allocation of `B` on `device_id`, allocated on a
// stream that reached the allocation before any work gpumem orders after it (same stream, or an
// event of it), and freed only in `drop`.
unsafe impl<B: StreamRuntime> BaseMemory<B> for MemoryAsync<B> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> DeviceId {
        self.device_id
    }
    fn identity(&self) -> &'static str {
        "MemoryAsync"
    }
}

impl<B: StreamRuntime> Drop for MemoryAsync<B> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let free = PendingFree {
            ptr: self.ptr,
            size: self.size,
            device: self.device_id,
            stream: self.stream.clone(),
        };
        drop_outside_callbacks::<B>(move || {
            if let Some(held) = free.try_free() {
                hold(held);
            }
        });
    }
}

/// A stream-ordered free not yet queued.
struct PendingFree<B: StreamRuntime> {
    ptr: DevicePtr,
    size: usize,
    device: DeviceId,
    stream: Stream<B>,
}

impl<B: StreamRuntime> PendingFree<B> {
    /// Queues the free on its stream, ordered after other streams' queued work on its bytes.
    /// Gives itself back when the stream captures (the free would become part of the graph).
    fn try_free(self) -> Option<Self> {
        let handle = self.stream.handle();
        if B::CAPS.capture {
            // SAFETY: `self.stream` holds the stream, so its handle is live.
            if let Ok(CaptureStatus::Active) = unsafe { B::capture_status(self.device, handle) } {
                return Some(self);
            }
        }
        let target = stream::target::<B>(Some(&self.stream));
        let range = (self.ptr, self.ptr.saturating_add(self.size));
        // SAFETY: `self.stream` holds the stream, so its handle is live for this function.
        let ordered = unsafe { inflight::begin(target, &[range], || []) };
        let result = ordered.and_then(|(queueing, _)| {
            // SAFETY: `ptr` came from `malloc_async(device, _)` and is freed once (this value is
            // consumed); every use gpumem queued is done (it held the memory) or the stream was
            // just made to wait for it; the handle is live.
            let r = unsafe { B::free_async(self.device, self.ptr, handle) };
            drop(queueing);
            r
        });
        if let Err(e) = result {
            // The memory is lost to the pool either way; the error waits for a synchronize.
            record_drop_error::<B>(e);
        }
        None
    }
}

type Retry = Box<dyn FnMut() -> bool + Send>;

/// Frees held back because their stream was capturing, of every backend: each entry retries its
/// free and says whether it is done.
fn pending() -> &'static Mutex<Vec<Retry>> {
    static PENDING: OnceLock<Mutex<Vec<Retry>>> = OnceLock::new();
    PENDING.get_or_init(|| Mutex::new(Vec::new()))
}

fn hold<B: StreamRuntime>(free: PendingFree<B>) {
    let mut slot = Some(free);
    let retry: Retry = Box::new(move || match slot.take() {
        Some(f) => {
            slot = f.try_free();
            slot.is_none()
        }
        None => true,
    });
    pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(retry);
}

/// Queues the held-back frees whose streams no longer capture.
fn retry_pending_frees() {
    let mut retries = {
        let mut list = pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if list.is_empty() {
            return;
        }
        std::mem::take(&mut *list)
    };
    // Outside the lock: a free may run drops that hold frees back again.
    retries.retain_mut(|retry| !retry());
    pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(retries);
}

/// The number of frees held back because their stream was capturing (for tests and debugging).
#[must_use]
pub fn n_pending_async_frees() -> usize {
    pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
}

/// Allocates `size` bytes on the current device with the stream-ordered allocator, ordered on
/// the current stream (CuPy's `malloc_async`). No rounding, no limit: see [`MemoryAsyncPool`].
///
/// # Errors
///
/// As [`MemoryAsync::new`].
pub fn malloc_async<B: StreamRuntime>(size: usize) -> Result<MemoryPointer<B>> {
    Ok(MemoryPointer::from_memory(MemoryAsync::<B>::new(size, None)?))
}

/// The runtime's stream-ordered pool of every device: CuPy's `MemoryAsyncPool`. Every call acts
/// on the current device's default pool and allocates on the current stream.
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{Limit, MemoryAsyncPool};
///
/// let pool = MemoryAsyncPool::<Host>::new()?;
/// let p = pool.malloc(1000)?; // rounded to 1024 bytes
/// p.memset(1, 1000)?;
/// assert!(pool.used_bytes()? >= 1024);
/// assert_eq!(pool.get_limit()?, 0, "no limit: 0, as every pool says it");
/// pool.set_limit(Limit::Bytes(1 << 20))?;
/// assert_eq!(pool.get_limit()?, 1 << 20);
/// pool.set_limit(Limit::Bytes(0))?; // unlimited again
/// drop(p);
/// pool.free_all_blocks(None)?;
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct MemoryAsyncPool<B: StreamRuntime> {
    _backend: PhantomData<fn() -> B>,
}

impl<B: StreamRuntime> fmt::Debug for MemoryAsyncPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryAsyncPool<{}>", B::NAME)
    }
}

impl<B: StreamRuntime> MemoryAsyncPool<B> {
    /// The pool: each device's default stream-ordered pool, its limit set from
    /// `GPUMEM_GPU_MEMORY_LIMIT` (unset: no limit), as CuPy's `MemoryAsyncPool()` does for every
    /// device.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend or device without a stream-ordered allocator;
    /// `InvalidEnvironment` for a malformed limit; the runtime's error.
    pub fn new() -> Result<Self> {
        check_supported::<B>("MemoryAsyncPool")?;
        let limit = Limit::from_env()?.unwrap_or(Limit::Bytes(0));
        let pool = MemoryAsyncPool { _backend: PhantomData };
        for device in 0..device_count::<B>()? {
            pool.set_limit_on(device as DeviceId, limit)?;
        }
        Ok(pool)
    }

    /// Allocates `size` bytes, rounded up to 512, on the current device and stream (CuPy's
    /// `MemoryAsyncPool.malloc`).
    ///
    /// # Errors
    ///
    /// `LimitExceeded` when the pool would grow past its limit (CuPy's message);
    /// `OutOfMemory` after synchronising the current stream and retrying twice; `Unsupported`;
    /// the runtime's error.
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        let rounded = crate::pool::round_allocation(size)?;
        // The runtime cannot hold a pool to a hard limit; refuse to draw past it.
        let total = self.total_bytes()?;
        let free = total.saturating_sub(self.used_bytes()?);
        let mut limit = 0;
        if free < rounded {
            limit = self.get_limit()?;
            if limit != 0 && limit.max(total) < total.saturating_add(rounded) {
                return Err(Error::LimitExceeded { size, total, limit });
            }
        }
        let mut retries = 0;
        loop {
            match MemoryAsync::<B>::new(rounded, None) {
                Ok(mem) => return Ok(MemoryPointer::from_memory(mem)),
                Err(e) if e.is_out_of_memory() && retries < OOM_RETRIES => {
                    retries += 1;
                    // Frees queued on the stream become reusable once it has reached them.
                    Stream::<B>::current().synchronize()?;
                }
                Err(e) if e.is_out_of_memory() => {
                    return Err(if limit == 0 {
                        Error::OutOfMemory { size, total: Some(total) }
                    } else {
                        Error::LimitExceeded { size, total, limit }
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Synchronises `stream` (the current stream for `None`), so the frees queued on it are
    /// done, and releases the current device's free pool memory to the system
    /// (`cuMemPoolTrimTo(pool, 0)`), as CuPy's `free_all_blocks`.
    ///
    /// Memory the program dropped while work on it was queued is freed only once that work is
    /// done, which the first synchronisation finds out; its free then goes to its own stream, so
    /// the stream is synchronised a second time before the trim (for memory allocated on another
    /// stream, the trim takes it once that stream has reached the free).
    ///
    /// # Errors
    ///
    /// The runtime's error synchronising or trimming.
    pub fn free_all_blocks(&self, stream: Option<&Stream<B>>) -> Result<()> {
        let stream = stream.cloned().unwrap_or_else(Stream::current);
        stream.synchronize()?;
        retry_pending_frees();
        stream.synchronize()?;
        B::async_pool_trim_to(current_device::<B>(), 0)
    }

    /// Not offered: the runtime does not tell how its free memory is split (CuPy raises
    /// `NotImplementedError('This function is not supported in MemoryAsyncPool')`).
    ///
    /// # Errors
    ///
    /// Always `Unsupported`.
    pub fn n_free_blocks(&self) -> Result<usize> {
        Err(Error::Unsupported { operation: "MemoryAsyncPool::n_free_blocks", backend: B::NAME })
    }

    /// Bytes lent out from the current device's pool (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// `Unsupported`; the runtime's error.
    pub fn used_bytes(&self) -> Result<usize> {
        self.attribute(AsyncPoolAttribute::UsedCurrent)
    }

    /// Bytes the current device's pool holds from the device
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// `Unsupported`; the runtime's error.
    pub fn total_bytes(&self) -> Result<usize> {
        self.attribute(AsyncPoolAttribute::ReservedCurrent)
    }

    /// Bytes the current device's pool holds and has not lent: `total_bytes() - used_bytes()`.
    ///
    /// # Errors
    ///
    /// `Unsupported`; the runtime's error.
    pub fn free_bytes(&self) -> Result<usize> {
        Ok(self.total_bytes()?.saturating_sub(self.used_bytes()?))
    }

    /// Sets the current device's soft limit, the pool's release threshold (CuPy's `set_limit`);
    /// `Limit::Bytes(0)` and `Limit::Fraction(0.0)` mean no limit (a threshold of `u64::MAX`, so
    /// the pool never shrinks by itself).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a fraction out of `0..=1`; `Unsupported`; the runtime's error.
    pub fn set_limit(&self, limit: Limit) -> Result<()> {
        self.set_limit_on(current_device::<B>(), limit)
    }

    fn set_limit_on(&self, device: DeviceId, limit: Limit) -> Result<()> {
        limit.validate()?;
        let bytes = match limit {
            Limit::Bytes(b) => b,
            Limit::Fraction(0.0) => 0,
            Limit::Fraction(_) => limit.bytes(B::mem_get_info(device)?.total),
        };
        let threshold = if bytes == 0 { u64::MAX } else { bytes as u64 };
        B::async_pool_set_release_threshold(device, threshold)
    }

    /// The current device's limit in bytes: the release threshold; 0 when unlimited, as every
    /// pool's `get_limit` and [`Limit::Bytes`] say it (CuPy returns the threshold's maximum,
    /// `2**64-1`, here: gpumem spells unlimited one way).
    ///
    /// # Errors
    ///
    /// `Unsupported`; the runtime's error.
    pub fn get_limit(&self) -> Result<usize> {
        match self.attribute(AsyncPoolAttribute::ReleaseThreshold)? {
            usize::MAX => Ok(0),
            bytes => Ok(bytes),
        }
    }

    fn attribute(&self, attribute: AsyncPoolAttribute) -> Result<usize> {
        check_supported::<B>("MemoryAsyncPool")?;
        let value = B::async_pool_attribute(current_device::<B>(), attribute)?;
        Ok(usize::try_from(value).unwrap_or(usize::MAX))
    }
}

impl<B: StreamRuntime> Allocator<B> for MemoryAsyncPool<B> {
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        MemoryAsyncPool::malloc(self, size)
    }
}
