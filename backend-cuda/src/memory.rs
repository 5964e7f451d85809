//! Memory: device allocations, pinned host allocations, the stream-ordered allocator, and the
//! copies and memsets between them.
//!
//! Which calls block the host, as CUDA defines it: `cuMemcpy` returns once the copy is done for
//! device-to-host and pinned host-to-device copies, once the source is staged for pageable
//! host-to-device copies, and *before* the copy is done for device-to-device copies; `cuMemsetD8`
//! returns before the memset is done for device memory. The contract promises that a synchronous
//! copy is done when it returns, and gpumem's synchronous memset does the same, so both wait for
//! the legacy default stream after queueing on it. Without that, work on a non-blocking stream
//! (which does not wait for the legacy stream) could see the bytes before the copy or memset
//! wrote them, and a pooled block could be reused under a memset still in flight.

use std::ffi::c_void;
use std::ptr;

use crate::sys::{self, CUdeviceptr, CUmemoryPool};
use gpumem_core::{AsyncPoolAttribute, DeviceId, DevicePtr, Error, MemoryOps, Result};

use crate::device::{self, make_current, DeviceSlot};
use crate::legacy;
use crate::result::{check, check_alloc, BACKEND};
use crate::stream::CudaStream;
use crate::Cuda;

/// A gpumem address as the driver's `CUdeviceptr` (both are 64-bit; see the crate's pointer-width
/// check).
#[inline]
fn dptr(ptr: DevicePtr) -> CUdeviceptr {
    ptr as CUdeviceptr
}

/// Checks that the device has a stream-ordered allocator and, the first time, raises its default
/// pool's release threshold to `u64::MAX`. Returns the default pool.
///
/// The threshold is how many free bytes the pool keeps at a synchronisation; its default is 0, so
/// every stream, event or context synchronisation hands all free memory back to the driver, and
/// the next `cuMemAllocAsync` maps it again, which is slower than `cuMemAlloc`. With the
/// threshold at its maximum the pool keeps its memory, as CuPy's `MemoryAsyncPool` does by
/// default, until it is trimmed. A threshold set later (`MemoryAsyncPool::set_limit`) is never
/// undone here: this runs before it, once per device.
fn prepare_async_pool(slot: &DeviceSlot, operation: &'static str) -> Result<CUmemoryPool> {
    let supported = match slot.async_pool.get() {
        Some(&supported) => supported,
        None => {
            let supported = device::attribute(slot, sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0;
            if supported {
                set_pool_attribute(default_pool(slot)?, sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX)?;
            }
            // Two threads may both get here; raising the threshold twice is harmless.
            let _ = slot.async_pool.set(supported);
            supported
        }
    };
    if supported {
        default_pool(slot)
    } else {
        Err(Error::Unsupported { operation, backend: BACKEND })
    }
}

/// The device's default memory pool (the one `cuMemAllocAsync` uses unless a program made another
/// current with `cuDeviceSetMemPool`).
fn default_pool(slot: &DeviceSlot) -> Result<CUmemoryPool> {
    let mut pool: CUmemoryPool = ptr::null_mut();
    // SAFETY: the driver is initialised; the handle is the driver's; `pool` is a valid
    // out-pointer.
    check("cuDeviceGetDefaultMemPool", unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, slot.handle) })?;
    Ok(pool)
}

/// Sets a `cuuint64_t` attribute of `pool`.
fn set_pool_attribute(pool: CUmemoryPool, attribute: std::ffi::c_int, value: u64) -> Result<()> {
    let mut value = value;
    // SAFETY: `pool` is a live pool; the attributes passed here are read from a `cuuint64_t`,
    // which `value` is, and only during the call.
    check("cuMemPoolSetAttribute", unsafe {
        sys::cuMemPoolSetAttribute(pool, attribute, (&mut value as *mut u64).cast::<c_void>())
    })
}

/// Waits for the legacy default stream of the current context: what makes the synchronous copy
/// and memset done when they return (see the module docs).
fn wait_for_legacy_stream(api: &'static str) -> Result<()> {
    // SAFETY: the caller made a context current; the legacy stream handle is always valid.
    check(api, unsafe { sys::cuStreamSynchronize(CudaStream::LEGACY.as_raw()) })
}

impl MemoryOps for Cuda {
    /// Allocates `size` bytes of device memory on `dev` (`cuMemAlloc`, 256-byte aligned or more).
    ///
    /// # Errors
    ///
    /// `OutOfMemory`; the driver's error.
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        make_current(dev)?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `dev`'s context is current; `ptr` is a valid out-pointer.
        check_alloc("cuMemAlloc_v2", unsafe { sys::cuMemAlloc_v2(&mut ptr, size) }, size)?;
        Ok(ptr as DevicePtr)
    }

    /// Frees memory from [`Self::malloc`]. `cuMemFree` waits for the device's work first.
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc(dev, _)` and is freed once.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees `ptr` is a live allocation of this context, freed once.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(dptr(ptr)) })
    }

    /// Allocates `size` bytes of pinned host memory, portable (usable from every context), as CuPy's
    /// `_malloc` for pinned memory (`hostAllocPortable`).
    ///
    /// # Errors
    ///
    /// `OutOfMemory`; the driver's error.
    fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8> {
        make_current(dev)?;
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: a context is current; `ptr` is a valid out-pointer; the flag is the driver's.
        let r = unsafe { sys::cuMemHostAlloc(&mut ptr, size, sys::CU_MEMHOSTALLOC_PORTABLE) };
        check_alloc("cuMemHostAlloc", r, size)?;
        Ok(ptr.cast::<u8>())
    }

    /// Frees memory from [`Self::malloc_host`].
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc_host` and is freed once.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees `ptr` is a live pinned allocation, freed once.
        check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(ptr.cast::<c_void>()) })
    }

    /// Allocates `size` bytes from `dev`'s default memory pool, ordered on `stream`.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; `OutOfMemory`; the driver's error.
    unsafe fn malloc_async(dev: DeviceId, size: usize, stream: CudaStream) -> Result<DevicePtr> {
        let slot = make_current(dev)?;
        let _legacy = legacy::enter("cuMemAllocAsync", dev, stream)?;
        prepare_async_pool(slot, "malloc_async")?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `dev`'s context is current; `ptr` is a valid out-pointer; the stream handle is
        // live (the `Backend` contract).
        let r = unsafe { sys::cuMemAllocAsync(&mut ptr, size, stream.as_raw()) };
        check_alloc("cuMemAllocAsync", r, size)?;
        Ok(ptr as DevicePtr)
    }

    /// Frees memory from [`Self::malloc_async`], ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc_async` and is freed once, after the work that uses it on `stream`.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuMemFreeAsync", dev, stream)?;
        // SAFETY: the caller guarantees `ptr` is a live stream-ordered allocation, freed once; the
        // stream handle is live.
        check("cuMemFreeAsync", unsafe { sys::cuMemFreeAsync(dptr(ptr), stream.as_raw()) })
    }

    /// Reads an attribute of `dev`'s default memory pool (`cuMemPoolGetAttribute`).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the driver's error.
    fn async_pool_attribute(dev: DeviceId, attribute: AsyncPoolAttribute) -> Result<u64> {
        let pool = prepare_async_pool(make_current(dev)?, "MemoryAsyncPool")?;
        let attribute = match attribute {
            AsyncPoolAttribute::ReleaseThreshold => sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            AsyncPoolAttribute::ReservedCurrent => sys::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            AsyncPoolAttribute::UsedCurrent => sys::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        };
        let mut value: u64 = 0;
        // SAFETY: `pool` is the device's default pool; these three attributes are written as a
        // `cuuint64_t`, which `value` is, during the call only.
        check("cuMemPoolGetAttribute", unsafe {
            sys::cuMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast::<c_void>())
        })?;
        Ok(value)
    }

    /// Sets the release threshold of `dev`'s default memory pool.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the driver's error.
    fn async_pool_set_release_threshold(dev: DeviceId, bytes: u64) -> Result<()> {
        let pool = prepare_async_pool(make_current(dev)?, "MemoryAsyncPool")?;
        set_pool_attribute(pool, sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes)
    }

    /// Releases the free memory of `dev`'s default memory pool down to `keep` bytes
    /// (`cuMemPoolTrimTo`).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the driver's error.
    fn async_pool_trim_to(dev: DeviceId, keep: usize) -> Result<()> {
        let pool = prepare_async_pool(make_current(dev)?, "MemoryAsyncPool")?;
        // SAFETY: `pool` is the device's default pool.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(pool, keep) })
    }

    /// Copies `n` bytes on the legacy default stream, direction inferred (unified addressing), and
    /// returns when the copy is done.
    ///
    /// # Safety
    ///
    /// Both ranges are valid for the copy and do not overlap.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuMemcpy", dev, CudaStream::LEGACY)?;
        // SAFETY: `dev`'s context is current; the caller guarantees both ranges.
        check("cuMemcpy", unsafe { sys::cuMemcpy(dptr(dst), dptr(src), n) })?;
        wait_for_legacy_stream("cuStreamSynchronize")
    }

    /// Copies `n` bytes, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// Both ranges stay valid until the stream reaches the copy; host memory is pinned.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: CudaStream,
    ) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuMemcpyAsync", dev, stream)?;
        // SAFETY: `dev`'s context is current; the caller guarantees both ranges until the stream
        // reaches the copy; the stream handle is live.
        check("cuMemcpyAsync", unsafe { sys::cuMemcpyAsync(dptr(dst), dptr(src), n, stream.as_raw()) })
    }

    /// Sets `n` bytes to `value` on the legacy default stream and returns when that is done.
    ///
    /// # Safety
    ///
    /// `dst..dst + n` is writable device memory.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuMemsetD8_v2", dev, CudaStream::LEGACY)?;
        // SAFETY: `dev`'s context is current; the caller guarantees the range.
        check("cuMemsetD8_v2", unsafe { sys::cuMemsetD8_v2(dptr(dst), value, n) })?;
        wait_for_legacy_stream("cuStreamSynchronize")
    }

    /// Sets `n` bytes to `value`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `dst..dst + n` stays writable device memory until the stream reaches the memset.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: CudaStream,
    ) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuMemsetD8Async", dev, stream)?;
        // SAFETY: `dev`'s context is current; the caller guarantees the range until the stream
        // reaches the memset; the stream handle is live.
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(dptr(dst), value, n, stream.as_raw()) })
    }
}
