//! Pinned (page-locked) host memory: what asynchronous host transfers read from and write to.
//!
//! [`PinnedMemory`] is one runtime allocation; [`PinnedMemoryPool`] caches them with CuPy's rules
//! (sizes rounded to 512 bytes and then up to a power of two, exact-size free lists used LIFO, no
//! splitting, no arenas, no limit, no hooks; one retry after releasing the cache on
//! out-of-memory), which [`pool::pinned`](crate::pool::pinned) holds. [`PinnedMemoryPointer`] points into either and is what
//! `MemoryPointer::copy_from_host_async` / `copy_to_host_async` take. A transfer keeps its buffer
//! alive until it is done (the ownership model of `stream::inflight`), as CuPy's `_EventWatcher`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use crate::error::{Error, Result};
use crate::hal::DeviceId;
use crate::pool::pinned::{pinned_rounded_size, PinnedCache};
use crate::runtime::pointer::Offset;
use crate::runtime::state::{current_device, record_drop_error};
use crate::runtime::stream::StreamRuntime;

/// A block of pinned host memory of backend `B`.
///
/// # Safety
///
/// Implementors promise that `ptr()..ptr() + size()` is host memory pinned by backend `B`'s
/// runtime (or, for `size() == 0`, nothing), valid for reads and writes as long as the object
/// lives, and that the values never change.
pub unsafe trait PinnedBuffer<B: StreamRuntime>: Send + Sync + fmt::Debug + 'static {
    /// The start address.
    fn ptr(&self) -> *mut u8;
    /// The size in bytes.
    fn size(&self) -> usize;
}

/// One pinned host allocation (portable: usable from every device), freed when dropped: CuPy's
/// `PinnedMemory`.
pub struct PinnedMemory<B: StreamRuntime> {
    ptr: *mut u8,
    size: usize,
    device: DeviceId,
    _backend: PhantomData<fn() -> B>,
}

// SAFETY: the allocation is plain host memory owned by this value; nothing in it is tied to a
// thread, and all access goes through raw copies whose races are the user's to order (as with
// device memory).
unsafe impl<B: StreamRuntime> Send for PinnedMemory<B> {}
// SAFETY: as for `Send`: `&PinnedMemory` only exposes the address and size.
unsafe impl<B: StreamRuntime> Sync for PinnedMemory<B> {}

impl<B: StreamRuntime> PinnedMemory<B> {
    /// Allocates `size` bytes of pinned host memory; 0 allocates nothing (null pointer).
    ///
    /// # Errors
    ///
    /// `OutOfMemory`; the runtime's error.
    pub fn new(size: usize) -> Result<Self> {
        let device = current_device::<B>();
        let ptr = if size == 0 { std::ptr::null_mut() } else { B::malloc_host(device, size)? };
        Ok(PinnedMemory { ptr, size, device, _backend: PhantomData })
    }
}

impl<B: StreamRuntime> Drop for PinnedMemory<B> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            let (device, ptr) = (self.device, self.ptr as usize);
            // On the freeing thread: `cuMemFreeHost` waits for the device, and a stream may be
            // waiting for this thread.
            crate::runtime::state::free_in_background::<B>(Box::new(move || {
                // SAFETY: `ptr` came from `B::malloc_host` and is freed once, here. Transfers
                // using it keep it alive (the ownership model), so none is pending.
                if let Err(e) = unsafe { B::free_host(device, ptr as *mut u8) } {
                    record_drop_error::<B>(e);
                }
            }));
        }
    }
}

impl<B: StreamRuntime> fmt::Debug for PinnedMemory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<PinnedMemory {:p} size={}>", self.ptr, self.size)
    }
}

// SAFETY: one live pinned allocation of `B` until `drop`.
unsafe impl<B: StreamRuntime> PinnedBuffer<B> for PinnedMemory<B> {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
}

/// A pointer into pinned host memory: CuPy's `PinnedMemoryPointer`. Offsets work as on
/// [`MemoryPointer`](crate::MemoryPointer) and every access is bounds-checked.
///
/// The memory can be the target of asynchronous device-to-host copies, so gpumem gives no `&[u8]`
/// view of it safely: use [`read`](Self::read) and [`write`](Self::write) (after the stream has
/// passed the transfer) or the `unsafe` slice views.
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{PinnedMemoryPointer, Stream};
///
/// let s = Stream::<Host>::non_blocking()?;
/// let host = PinnedMemoryPointer::<Host>::alloc(4)?;
/// host.write(&[1, 2, 3, 4])?;
/// let dev = gpumem_core::alloc::<Host>(4)?;
/// dev.copy_from_host_async(&host, 4, Some(&s))?;
/// dev.copy_to_host_async(&(&host + 0), 4, Some(&s))?;
/// s.synchronize()?;
/// let mut out = [0u8; 4];
/// host.read(&mut out)?;
/// assert_eq!(out, [1, 2, 3, 4]);
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct PinnedMemoryPointer<B: StreamRuntime> {
    mem: Arc<dyn PinnedBuffer<B>>,
    offset: Offset,
}

impl<B: StreamRuntime> Clone for PinnedMemoryPointer<B> {
    fn clone(&self) -> Self {
        PinnedMemoryPointer { mem: Arc::clone(&self.mem), offset: self.offset }
    }
}

impl<B: StreamRuntime> fmt::Debug for PinnedMemoryPointer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<PinnedMemoryPointer {:p} mem={:?}>", self.ptr(), self.mem)
    }
}

impl<B: StreamRuntime> PinnedMemoryPointer<B> {
    /// A pointer to the start of `mem`.
    pub fn from_buffer(mem: Arc<dyn PinnedBuffer<B>>) -> Self {
        PinnedMemoryPointer { mem, offset: Offset::ZERO }
    }

    /// Allocates `size` bytes of pinned memory without a pool (CuPy's `_malloc` for pinned
    /// memory).
    ///
    /// # Errors
    ///
    /// As [`PinnedMemory::new`].
    pub fn alloc(size: usize) -> Result<Self> {
        Ok(Self::from_buffer(Arc::new(PinnedMemory::<B>::new(size)?)))
    }

    /// The address this pointer points to.
    #[must_use]
    pub fn ptr(&self) -> *mut u8 {
        self.offset.address(self.mem.ptr() as usize) as *mut u8
    }

    /// Bytes from this pointer to the end of its memory (CuPy's `size()`); 0 outside it.
    #[must_use]
    pub fn size(&self) -> usize {
        self.offset.remaining(self.mem.size())
    }

    /// The offset from the start of the memory.
    #[must_use]
    pub fn offset(&self) -> isize {
        self.offset.saturated()
    }

    pub(crate) fn buffer(&self) -> Arc<dyn PinnedBuffer<B>> {
        Arc::clone(&self.mem)
    }

    /// The address of `len` bytes from this pointer, if they lie within the memory.
    pub(crate) fn check(&self, len: usize, operation: &'static str) -> Result<usize> {
        self.offset.check(self.mem.ptr() as usize, self.mem.size(), len, operation)
    }

    /// Copies `data` into the memory at this pointer, after the queued transfers that use these
    /// bytes are done (gpumem waits for them).
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `data` does not fit.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        let dst = self.check(data.len(), "pinned write")? as *mut u8;
        if !data.is_empty() {
            // Transfers queued on these bytes finish first, and none is queued while it runs.
            let range = (dst as usize, dst as usize + data.len());
            crate::runtime::stream::inflight::access::<B, _, _>(
                &[range],
                || [],
                || {
                    // SAFETY: `dst..dst+len` was checked to lie in the live pinned allocation, which
                    // `data` (a Rust borrow) cannot overlap.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from the memory at this pointer into `out`, after the queued
    /// transfers that use these bytes are done (gpumem waits for them).
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `out` is longer than the memory left.
    pub fn read(&self, out: &mut [u8]) -> Result<()> {
        let src = self.check(out.len(), "pinned read")? as *const u8;
        if !out.is_empty() {
            // Transfers queued on these bytes finish first, and none is queued while it runs.
            let range = (src as usize, src as usize + out.len());
            crate::runtime::stream::inflight::access::<B, _, _>(
                &[range],
                || [],
                || {
                    // SAFETY: as in `write`, in the other direction.
                    unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    /// The memory from this pointer to its end, as a slice.
    ///
    /// # Safety
    ///
    /// No transfer writes these bytes while the slice lives.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when the pointer is outside its memory.
    pub unsafe fn as_slice(&self) -> Result<&[u8]> {
        let len = self.size();
        let p = self.check(len, "pinned slice")? as *const u8;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: the range lies in the live allocation; no writer, by the caller's promise.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// The memory from this pointer to its end, as a mutable slice.
    ///
    /// # Safety
    ///
    /// No transfer reads or writes these bytes, and no other view of them exists, while the
    /// slice lives.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when the pointer is outside its memory.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> Result<&mut [u8]> {
        let len = self.size();
        let p = self.check(len, "pinned slice")? as *mut u8;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the range lies in the live allocation; exclusive, by the caller's promise.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}

crate::runtime::pointer::pointer_arithmetic!(PinnedMemoryPointer);

/// Allocates raw pinned memory for a [`PinnedMemoryPool`]. The default calls the runtime; tests
/// and embedders supply their own.
pub trait PinnedAllocator<B: StreamRuntime>: Send + Sync {
    /// Allocates `size > 0` bytes.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` makes the pool release its cache and retry once; other errors propagate.
    fn allocate(&self, size: usize) -> Result<Box<dyn PinnedBuffer<B>>>;
}

/// The runtime's pinned allocator ([`PinnedMemory::new`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct RuntimePinnedAllocator;

impl<B: StreamRuntime> PinnedAllocator<B> for RuntimePinnedAllocator {
    fn allocate(&self, size: usize) -> Result<Box<dyn PinnedBuffer<B>>> {
        Ok(Box::new(PinnedMemory::<B>::new(size)?))
    }
}

type Cache<B> = PinnedCache<Box<dyn PinnedBuffer<B>>>;

/// A cache of pinned host buffers: CuPy's `PinnedMemoryPool`, with the rules of
/// [`pool::pinned`](crate::pool::pinned).
pub struct PinnedMemoryPool<B: StreamRuntime> {
    allocator: Box<dyn PinnedAllocator<B>>,
    free: Arc<Cache<B>>,
}

impl<B: StreamRuntime> fmt::Debug for PinnedMemoryPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedMemoryPool").field("n_free_blocks", &self.n_free_blocks()).finish()
    }
}

impl<B: StreamRuntime> Default for PinnedMemoryPool<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// A buffer lent by a [`PinnedMemoryPool`]; it goes back to the pool's free list when dropped
/// (or is freed, if the pool is gone).
struct PooledPinnedMemory<B: StreamRuntime> {
    buffer: Option<Box<dyn PinnedBuffer<B>>>,
    pool: Weak<Cache<B>>,
}

impl<B: StreamRuntime> fmt::Debug for PooledPinnedMemory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<PooledPinnedMemory {:p} size={}>", self.ptr(), self.size())
    }
}

impl<B: StreamRuntime> Drop for PooledPinnedMemory<B> {
    fn drop(&mut self) {
        if let (Some(buffer), Some(pool)) = (self.buffer.take(), self.pool.upgrade()) {
            pool.give_back(buffer.size(), buffer);
        }
    }
}

// SAFETY: forwards to the pool's buffer, which this value owns until `drop`.
unsafe impl<B: StreamRuntime> PinnedBuffer<B> for PooledPinnedMemory<B> {
    fn ptr(&self) -> *mut u8 {
        self.buffer.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr())
    }
    fn size(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.size())
    }
}

impl<B: StreamRuntime> PinnedMemoryPool<B> {
    /// A pool on the runtime's pinned allocator.
    #[must_use]
    pub fn new() -> Self {
        Self::with_allocator(Box::new(RuntimePinnedAllocator))
    }

    /// A pool on the given allocator.
    #[must_use]
    pub fn with_allocator(allocator: Box<dyn PinnedAllocator<B>>) -> Self {
        PinnedMemoryPool { allocator, free: Arc::new(PinnedCache::new()) }
    }

    /// The size the pool allocates for a request: rounded to 512 bytes, then up to a power of two
    /// (CuPy's `clp2`; 1000 and 1024 both take 1024 bytes). `None` when that overflows.
    #[must_use]
    pub fn rounded_size(size: usize) -> Option<usize> {
        pinned_rounded_size(size)
    }

    /// Lends a buffer of at least `size` bytes. Size 0 gives an empty, unpooled buffer.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the runtime cannot pin the memory even after the cache was released;
    /// the allocator's other errors.
    pub fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer<B>> {
        crate::runtime::stream::inflight::collect::<B>();
        if size == 0 {
            return PinnedMemoryPointer::alloc(0);
        }
        let rounded = Self::rounded_size(size).ok_or_else(|| Error::OutOfMemory { size, total: None })?;
        let buffer = self.free.lend(rounded, |n| self.allocator.allocate(n), Error::is_out_of_memory)?;
        let pooled = PooledPinnedMemory { buffer: Some(buffer), pool: Arc::downgrade(&self.free) };
        Ok(PinnedMemoryPointer::from_buffer(Arc::new(pooled)))
    }

    /// Frees every cached buffer (buffers still lent out are unaffected).
    pub fn free_all_blocks(&self) {
        crate::runtime::stream::inflight::collect::<B>();
        drop(self.free.release());
    }

    /// The number of cached buffers.
    #[must_use]
    pub fn n_free_blocks(&self) -> usize {
        self.free.n_free_blocks()
    }
}

/// Something that hands out pinned host memory: a [`PinnedMemoryPool`], unpooled pinned memory,
/// or the program's own. Closures `Fn(usize) -> Result<PinnedMemoryPointer<B>>` are pinned
/// allocators.
pub trait PinnedMemoryAllocator<B: StreamRuntime>: Send + Sync {
    /// Allocates `size` bytes of pinned host memory.
    ///
    /// # Errors
    ///
    /// The allocator's.
    fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer<B>>;
}

impl<B: StreamRuntime, F> PinnedMemoryAllocator<B> for F
where
    F: Fn(usize) -> Result<PinnedMemoryPointer<B>> + Send + Sync,
{
    fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer<B>> {
        self(size)
    }
}

impl<B: StreamRuntime> PinnedMemoryAllocator<B> for PinnedMemoryPool<B> {
    fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer<B>> {
        PinnedMemoryPool::malloc(self, size)
    }
}

/// No pool: every pinned allocation is a runtime allocation, freed when its last pointer goes
/// (CuPy's pinned `_malloc`, what `set_pinned_memory_allocator(None)` selects).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainPinnedAllocator;

impl<B: StreamRuntime> PinnedMemoryAllocator<B> for PlainPinnedAllocator {
    fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer<B>> {
        PinnedMemoryPointer::alloc(size)
    }
}
