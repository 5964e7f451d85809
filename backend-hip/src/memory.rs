//! Memory and transfers: device memory, pinned host memory, the stream-ordered allocator,
//! copies and memsets.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use gpumem_core::{DeviceId, DevicePtr, Result};
use hip_sys::hiprt::{hipHostMallocPortable, hipMemPoolAttr, hipMemPool_t, hipMemcpyKind};

use crate::device::{memory_pools_supported, set_device};
use crate::result::{check, check_alloc, init, sys, unsupported};
use crate::stream::HipStream;

/// Allocates `size` bytes of device memory on `dev` (`hipMalloc`: at least 256-byte aligned).
pub(crate) fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
    set_device(dev)?;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    check_alloc("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, size) }, size)?;
    Ok(ptr as DevicePtr)
}

/// Frees memory from [`malloc`].
///
/// # Safety
///
/// As `Backend::free`.
pub(crate) unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees `ptr` came from `hipMalloc` and is freed once, with no work
    // pending on it.
    check("hipFree", unsafe { sys::hipFree(ptr as *mut c_void) })
}

/// Allocates `size` bytes of pinned host memory, portable to every device
/// (`hipHostMalloc(..., hipHostMallocPortable)`, CuPy's `hostAllocPortable`).
pub(crate) fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8> {
    set_device(dev)?;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the flag is one of HIP's.
    let code = unsafe { sys::hipHostMalloc(&mut ptr, size, hipHostMallocPortable) };
    check_alloc("hipHostMalloc", code, size)?;
    Ok(ptr.cast())
}

/// Frees memory from [`malloc_host`].
///
/// # Safety
///
/// As `Backend::free_host`.
pub(crate) unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees `ptr` came from `hipHostMalloc` and is freed once, with no
    // transfer pending on it.
    check("hipHostFree", unsafe { sys::hipHostFree(ptr.cast()) })
}

/// Per device: whether its stream-ordered allocator is ready (`true`: supported and its release
/// threshold raised) or absent (`false`). Sized by the device count on first use; a failure to
/// set the pool up is not recorded, so the next call tries again.
static ASYNC_POOLS: OnceLock<Box<[OnceLock<bool>]>> = OnceLock::new();

/// Makes sure `dev`'s default memory pool keeps what is freed into it: HIP, as CUDA, releases
/// a pool's free memory to the system at every synchronisation while the release threshold is
/// 0 (the default), which makes `hipMallocAsync` as slow as `hipMalloc`. The threshold is raised
/// to the maximum once per device, as the CUDA backend does.
fn prepare_async_pool(dev: DeviceId) -> Result<()> {
    let count = init()?;
    let cells = ASYNC_POOLS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
    let cell = usize::try_from(dev).ok().and_then(|i| cells.get(i));
    if let Some(&ready) = cell.and_then(OnceLock::get) {
        return if ready { Ok(()) } else { Err(unsupported("malloc_async")) };
    }
    if !memory_pools_supported(dev)? {
        if let Some(cell) = cell {
            let _ = cell.set(false);
        }
        return Err(unsupported("malloc_async"));
    }
    let mut pool: hipMemPool_t = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    check("hipDeviceGetDefaultMemPool", unsafe { sys::hipDeviceGetDefaultMemPool(&mut pool, dev) })?;
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is the device's live default pool; the release threshold attribute takes a
    // pointer to a `uint64_t`, which `threshold` is, and is only read during the call.
    let code = unsafe {
        sys::hipMemPoolSetAttribute(
            pool,
            hipMemPoolAttr::hipMemPoolAttrReleaseThreshold,
            (&mut threshold as *mut u64).cast(),
        )
    };
    check("hipMemPoolSetAttribute", code)?;
    if let Some(cell) = cell {
        let _ = cell.set(true);
    }
    Ok(())
}

/// Allocates `size` bytes from `dev`'s stream-ordered allocator, ordered on `stream`
/// (`hipMallocAsync`, in HIP since 5.1 and marked beta in 5.2's headers). `Unsupported` where the
/// device reports no memory pools.
///
/// CuPy refuses `malloc_async` on HIP altogether ("HIP does not support memory_async"); gpumem
/// offers it where the runtime says the device has it.
pub(crate) fn malloc_async(dev: DeviceId, size: usize, stream: HipStream) -> Result<DevicePtr> {
    set_device(dev)?;
    prepare_async_pool(dev)?;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; `stream` is a live handle (the `Backend` contract).
    check_alloc("hipMallocAsync", unsafe { sys::hipMallocAsync(&mut ptr, size, stream.handle()) }, size)?;
    Ok(ptr as DevicePtr)
}

/// Frees memory from [`malloc_async`], ordered on `stream`.
///
/// # Safety
///
/// As `Backend::free_async`.
pub(crate) unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HipStream) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees `ptr` came from `hipMallocAsync`, is freed once, and that the
    // work using it is ordered before this free on `stream`.
    check("hipFreeAsync", unsafe { sys::hipFreeAsync(ptr as *mut c_void, stream.handle()) })
}

/// Copies `n` bytes on the null stream (HIP's blocking default stream, which is what the CUDA
/// backend's legacy stream is), the direction taken from the addresses (`hipMemcpyDefault`).
///
/// # Safety
///
/// As `Backend::memcpy`.
pub(crate) unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees both ranges are valid for the copy and do not overlap.
    let code = unsafe {
        sys::hipMemcpy(dst as *mut c_void, src as *const c_void, n, hipMemcpyKind::hipMemcpyDefault)
    };
    check("hipMemcpy", code)
}

/// Copies `n` bytes, ordered on `stream`.
///
/// # Safety
///
/// As `Backend::memcpy_async`.
pub(crate) unsafe fn memcpy_async(
    dev: DeviceId,
    dst: DevicePtr,
    src: DevicePtr,
    n: usize,
    stream: HipStream,
) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees both ranges stay valid and disjoint until the stream reaches
    // the copy, and that host memory is pinned; `stream` is live.
    let code = unsafe {
        sys::hipMemcpyAsync(
            dst as *mut c_void,
            src as *const c_void,
            n,
            hipMemcpyKind::hipMemcpyDefault,
            stream.handle(),
        )
    };
    check("hipMemcpyAsync", code)
}

/// Sets `n` bytes to `value` on the null stream.
///
/// # Safety
///
/// As `Backend::memset`.
pub(crate) unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees the range is writable device memory.
    check("hipMemset", unsafe { sys::hipMemset(dst as *mut c_void, c_int::from(value), n) })
}

/// Sets `n` bytes to `value`, ordered on `stream`.
///
/// # Safety
///
/// As `Backend::memset_async`.
pub(crate) unsafe fn memset_async(
    dev: DeviceId,
    dst: DevicePtr,
    value: u8,
    n: usize,
    stream: HipStream,
) -> Result<()> {
    set_device(dev)?;
    // SAFETY: the caller guarantees the range stays writable until the stream reaches the
    // memset; `stream` is live.
    let code = unsafe { sys::hipMemsetAsync(dst as *mut c_void, c_int::from(value), n, stream.handle()) };
    check("hipMemsetAsync", code)
}
