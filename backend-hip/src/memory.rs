//! Memory: device allocations, pinned host allocations, the stream-ordered allocator, and the
//! copies and memsets between them.
//!
//! Which calls block the host: HIP's documentation promises less than CUDA's here. HIP 5.2's
//! runtime (hipamd) runs `hipMemcpy` and `hipMemset` on the null stream and waits for the command
//! before returning, but that is how it is built, not what its API promises, and CUDA's
//! `cuMemcpy` and `cuMemsetD8` return early in several cases. The contract promises that a
//! synchronous copy is done when it returns, and gpumem's synchronous memset does the same, so,
//! as the CUDA backend does, both wait for the legacy default stream (HIP's null stream) after
//! queueing on it; when the runtime has already waited, that wait returns at once.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use gpumem_core::{AsyncPoolAttribute, DeviceId, DeviceOps, DevicePtr, MemoryOps, Result};
use hip_sys::hiprt::{hipHostMallocPortable, hipMemPoolAttr, hipMemPool_t, hipMemcpyKind};

use crate::device::{self, make_current};
use crate::result::{self, check, check_alloc, sys};
use crate::stream::HipStream;
use crate::Hip;

/// A gpumem address as the pointer HIP takes.
#[inline]
pub(crate) fn dptr(ptr: DevicePtr) -> *mut c_void {
    ptr as *mut c_void
}

/// Per device, once known: whether its stream-ordered allocator is there (and its release
/// threshold raised). The CUDA backend keeps this in its device table; HIP needs no device table
/// (see `device`), so it is kept here, sized by the device count on first use.
static ASYNC_POOLS: OnceLock<Box<[OnceLock<bool>]>> = OnceLock::new();

/// Checks that the device has a stream-ordered allocator and, the first time, raises its default
/// pool's release threshold to `u64::MAX`. Returns the default pool.
///
/// The threshold is how many free bytes the pool keeps at a synchronisation; its default is 0, so
/// every stream, event or device synchronisation hands all free memory back to the system, and
/// the next `hipMallocAsync` maps it again, which is slower than `hipMalloc`. With the threshold
/// at its maximum the pool keeps its memory, as CuPy's `MemoryAsyncPool` does by default, until
/// it is trimmed. A threshold set later (`MemoryAsyncPool::set_limit`) is never undone here: this
/// runs before it, once per device.
fn prepare_async_pool(dev: DeviceId, operation: &'static str) -> Result<hipMemPool_t> {
    let count = Hip::device_count()?;
    let pools = ASYNC_POOLS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
    // `make_current` accepted `dev`, so it is below the count; a slot is there.
    let slot = usize::try_from(dev).ok().and_then(|i| pools.get(i));
    let supported = match slot.and_then(OnceLock::get) {
        Some(&supported) => supported,
        None => {
            let supported = device::memory_pools_supported(dev)?;
            if supported {
                set_pool_attribute(
                    default_pool(dev)?,
                    hipMemPoolAttr::hipMemPoolAttrReleaseThreshold,
                    u64::MAX,
                )?;
            }
            // Two threads may both get here; raising the threshold twice is harmless.
            if let Some(slot) = slot {
                let _ = slot.set(supported);
            }
            supported
        }
    };
    if supported {
        default_pool(dev)
    } else {
        Err(result::unsupported(operation))
    }
}

/// The device's default memory pool.
fn default_pool(dev: DeviceId) -> Result<hipMemPool_t> {
    let mut pool: hipMemPool_t = ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; the ordinal is one the runtime accepted.
    check("hipDeviceGetDefaultMemPool", unsafe { sys::hipDeviceGetDefaultMemPool(&mut pool, dev) })?;
    Ok(pool)
}

/// Sets a `uint64_t` attribute of `pool`.
fn set_pool_attribute(pool: hipMemPool_t, attribute: hipMemPoolAttr, value: u64) -> Result<()> {
    let mut value = value;
    // SAFETY: `pool` is a live pool; the attributes passed here are read from a `uint64_t`, which
    // `value` is, and only during the call.
    check("hipMemPoolSetAttribute", unsafe {
        sys::hipMemPoolSetAttribute(pool, attribute, (&mut value as *mut u64).cast::<c_void>())
    })
}

/// Waits for the legacy default stream (HIP's null stream) of the current device: what makes
/// the synchronous copy and memset done when they return (see the module docs).
fn wait_for_legacy_stream(api: &'static str) -> Result<()> {
    // SAFETY: the null stream handle is always valid.
    check(api, unsafe { sys::hipStreamSynchronize(HipStream::LEGACY.as_raw()) })
}

impl MemoryOps for Hip {
    /// Allocates `size` bytes of device memory on `dev` (`hipMalloc`, 256-byte aligned or more).
    ///
    /// # Errors
    ///
    /// `OutOfMemory`; the runtime's error.
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        make_current(dev)?;
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: `dev` is current; `ptr` is a valid out-pointer.
        check_alloc("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, size) }, size)?;
        Ok(ptr as DevicePtr)
    }

    /// Frees memory from [`Self::malloc`]. `hipFree` waits for the device's work first.
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc(dev, _)` and is freed once.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees `ptr` is a live allocation of `dev`, freed once.
        check("hipFree", unsafe { sys::hipFree(dptr(ptr)) })
    }

    /// Allocates `size` bytes of pinned host memory, portable (usable from every device), as CuPy's
    /// `_malloc` for pinned memory (`hostAllocPortable`).
    ///
    /// # Errors
    ///
    /// `OutOfMemory`; the runtime's error.
    fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8> {
        make_current(dev)?;
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the flag is HIP's.
        let code = unsafe { sys::hipHostMalloc(&mut ptr, size, hipHostMallocPortable) };
        check_alloc("hipHostMalloc", code, size)?;
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
    /// The runtime's error.
    unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees `ptr` is a live pinned allocation, freed once.
        check("hipHostFree", unsafe { sys::hipHostFree(ptr.cast::<c_void>()) })
    }

    /// Allocates `size` bytes from `dev`'s default memory pool, ordered on `stream`
    /// (`hipMallocAsync`: exported since HIP 5.1, marked beta in 5.2's headers).
    ///
    /// CuPy refuses `malloc_async` on HIP altogether ("HIP does not support memory_async"); gpumem
    /// offers it where the runtime says the device has memory pools.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; `OutOfMemory`; the runtime's error.
    unsafe fn malloc_async(dev: DeviceId, size: usize, stream: HipStream) -> Result<DevicePtr> {
        make_current(dev)?;
        prepare_async_pool(dev, "malloc_async")?;
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: `dev` is current; `ptr` is a valid out-pointer; the stream handle is live (the
        // `Backend` contract).
        let code = unsafe { sys::hipMallocAsync(&mut ptr, size, stream.as_raw()) };
        check_alloc("hipMallocAsync", code, size)?;
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
    /// The runtime's error.
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HipStream) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees `ptr` is a live stream-ordered allocation, freed once; the
        // stream handle is live.
        check("hipFreeAsync", unsafe { sys::hipFreeAsync(dptr(ptr), stream.as_raw()) })
    }

    /// Reads an attribute of `dev`'s default memory pool (`hipMemPoolGetAttribute`, exported since
    /// HIP 5.1).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the runtime's error.
    fn async_pool_attribute(dev: DeviceId, attribute: AsyncPoolAttribute) -> Result<u64> {
        make_current(dev)?;
        let pool = prepare_async_pool(dev, "MemoryAsyncPool")?;
        let attribute = match attribute {
            AsyncPoolAttribute::ReleaseThreshold => hipMemPoolAttr::hipMemPoolAttrReleaseThreshold,
            AsyncPoolAttribute::ReservedCurrent => hipMemPoolAttr::hipMemPoolAttrReservedMemCurrent,
            AsyncPoolAttribute::UsedCurrent => hipMemPoolAttr::hipMemPoolAttrUsedMemCurrent,
        };
        let mut value: u64 = 0;
        // SAFETY: `pool` is the device's default pool; these three attributes are written as a
        // `uint64_t`, which `value` is, during the call only.
        check("hipMemPoolGetAttribute", unsafe {
            sys::hipMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast::<c_void>())
        })?;
        Ok(value)
    }

    /// Sets the release threshold of `dev`'s default memory pool.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the runtime's error.
    fn async_pool_set_release_threshold(dev: DeviceId, bytes: u64) -> Result<()> {
        make_current(dev)?;
        let pool = prepare_async_pool(dev, "MemoryAsyncPool")?;
        set_pool_attribute(pool, hipMemPoolAttr::hipMemPoolAttrReleaseThreshold, bytes)
    }

    /// Releases the free memory of `dev`'s default memory pool down to `keep` bytes
    /// (`hipMemPoolTrimTo`, exported since HIP 5.1).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a device without memory pools; the runtime's error.
    fn async_pool_trim_to(dev: DeviceId, keep: usize) -> Result<()> {
        make_current(dev)?;
        let pool = prepare_async_pool(dev, "MemoryAsyncPool")?;
        // SAFETY: `pool` is the device's default pool.
        check("hipMemPoolTrimTo", unsafe { sys::hipMemPoolTrimTo(pool, keep) })
    }

    /// Copies `n` bytes on the legacy default stream, direction inferred (`hipMemcpyDefault`, unified
    /// addressing), and returns when the copy is done.
    ///
    /// # Safety
    ///
    /// Both ranges are valid for the copy and do not overlap.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: `dev` is current; the caller guarantees both ranges.
        check("hipMemcpy", unsafe {
            sys::hipMemcpy(dptr(dst), dptr(src), n, hipMemcpyKind::hipMemcpyDefault)
        })?;
        wait_for_legacy_stream("hipStreamSynchronize")
    }

    /// Copies `n` bytes, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// Both ranges stay valid until the stream reaches the copy; host memory is pinned.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: HipStream,
    ) -> Result<()> {
        make_current(dev)?;
        // SAFETY: `dev` is current; the caller guarantees both ranges until the stream reaches the
        // copy; the stream handle is live.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(dptr(dst), dptr(src), n, hipMemcpyKind::hipMemcpyDefault, stream.as_raw())
        })
    }

    /// Sets `n` bytes to `value` on the legacy default stream and returns when that is done.
    ///
    /// # Safety
    ///
    /// `dst..dst + n` is writable device memory.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: `dev` is current; the caller guarantees the range.
        check("hipMemset", unsafe { sys::hipMemset(dptr(dst), c_int::from(value), n) })?;
        wait_for_legacy_stream("hipStreamSynchronize")
    }

    /// Sets `n` bytes to `value`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `dst..dst + n` stays writable device memory until the stream reaches the memset.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: HipStream,
    ) -> Result<()> {
        make_current(dev)?;
        // SAFETY: `dev` is current; the caller guarantees the range until the stream reaches the
        // memset; the stream handle is live.
        check("hipMemsetAsync", unsafe {
            sys::hipMemsetAsync(dptr(dst), c_int::from(value), n, stream.as_raw())
        })
    }
}
