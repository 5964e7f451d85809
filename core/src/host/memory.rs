//! Host "device" memory: zeroed, 512-byte aligned heap allocations, registered by address so
//! frees can be checked and pointers mapped back to their device.
//!
//! Each simulated device has a capacity (`GPUMEM_HOST_DEVICE_MEMORY` bytes, default 16 GiB) that
//! allocations count against, so out-of-memory behaves as on a GPU. Memory is zeroed because Rust
//! may not read uninitialised bytes, and a device-to-host copy of fresh memory would.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use std::sync::Arc;

use crate::error::{Error, Result};
use std::collections::HashMap;

use crate::hal::{AsyncPoolAttribute, DeviceId, DevicePtr, MemoryOps};

use super::result::{err, Code};
use super::worker::join_legacy;
use super::{enqueue, Host, HostStream};

/// The alignment of host allocations: the pool's unit, more than CUDA's 256 bytes.
const ALIGN: usize = 512;
const DEFAULT_DEVICES: usize = 2;
const DEFAULT_CAPACITY: usize = 16 << 30;

/// `GPUMEM_HOST_DEVICES`: the number of simulated devices.
pub(crate) const DEVICES_ENV: &str = "GPUMEM_HOST_DEVICES";
/// `GPUMEM_HOST_DEVICE_MEMORY`: each simulated device's memory in bytes.
pub(crate) const MEMORY_ENV: &str = "GPUMEM_HOST_DEVICE_MEMORY";
const DEVICES_FORMS: &str = "an integer from 1 to 64 (the number of simulated devices; default 2)";
const MEMORY_FORMS: &str =
    "a byte size, such as 17179869184, 16GiB or 512MiB (each simulated device's memory; default 16 GiB)";

/// The number of simulated devices from `GPUMEM_HOST_DEVICES` (1 to 64), default 2, so
/// multi-device code paths run on any machine; read once.
///
/// # Errors
///
/// `InvalidEnvironment` for a malformed value (every call reports it).
pub(crate) fn device_count_checked() -> Result<usize> {
    static N: OnceLock<Result<usize>> = OnceLock::new();
    N.get_or_init(|| {
        let count = |text: &str| text.parse::<usize>().ok().filter(|n| (1..=64).contains(n));
        Ok(crate::env::parse(DEVICES_ENV, DEVICES_FORMS, count)?.unwrap_or(DEFAULT_DEVICES))
    })
    .clone()
}

/// The number of simulated devices, for the backend's own tables: the default when the variable
/// is malformed (the error is reported by `device_count_checked`, which every typed path calls
/// first through `DeviceOps::device_count`).
pub(crate) fn device_count() -> usize {
    device_count_checked().unwrap_or(DEFAULT_DEVICES)
}

/// Each simulated device's memory in bytes, from `GPUMEM_HOST_DEVICE_MEMORY`; read once.
///
/// # Errors
///
/// `InvalidEnvironment` for a malformed value (every call reports it).
pub(crate) fn capacity_checked() -> Result<usize> {
    static C: OnceLock<Result<usize>> = OnceLock::new();
    C.get_or_init(|| {
        Ok(crate::env::parse(MEMORY_ENV, MEMORY_FORMS, crate::env::parse_byte_size)?
            .unwrap_or(DEFAULT_CAPACITY))
    })
    .clone()
}

#[derive(Clone, Copy, Debug)]
struct Allocation {
    size: usize,
    /// `None` for pinned host memory.
    device: Option<DeviceId>,
}

struct Registry {
    allocations: BTreeMap<DevicePtr, Allocation>,
    used: Vec<usize>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry { allocations: BTreeMap::new(), used: vec![0; device_count()] }))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn check_device(api: &'static str, dev: DeviceId) -> Result<usize> {
    device_count_checked()?;
    match usize::try_from(dev) {
        Ok(i) if i < device_count() => Ok(i),
        _ => Err(err(api, Code::InvalidDevice, Some(format!("device {dev}")))),
    }
}

/// The layout of an allocation of `size` bytes. A zero-size allocation takes one byte: the global
/// allocator may not be asked for zero bytes, and each allocation needs an address of its own
/// in the registry. It counts as zero bytes against the device's capacity.
fn layout_of(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.max(1), ALIGN).ok()
}

/// Allocates `size` zeroed bytes (a zero-size allocation still has an address of its own), for
/// `device` (`None`: pinned host memory).
pub(crate) fn allocate(api: &'static str, device: Option<DeviceId>, size: usize) -> Result<DevicePtr> {
    let layout = layout_of(size).ok_or_else(|| Error::size_too_large(size))?;
    let capacity = capacity_checked()?;
    let mut reg = registry();
    if let Some(dev) = device {
        let i = check_device(api, dev)?;
        if reg.used[i].checked_add(size).is_none_or(|u| u > capacity) {
            return Err(Error::OutOfMemory { size, total: None });
        }
        reg.used[i] += size;
    }
    // SAFETY: `layout` has a non-zero size (`layout_of` takes at least one byte) and a valid
    // alignment.
    let ptr = unsafe { alloc_zeroed(layout) };
    if ptr.is_null() {
        if let Some(dev) = device {
            reg.used[dev as usize] -= size;
        }
        return Err(Error::OutOfMemory { size, total: None });
    }
    reg.allocations.insert(ptr as DevicePtr, Allocation { size, device });
    Ok(ptr as DevicePtr)
}

/// Frees an allocation of the given kind.
pub(crate) fn release(api: &'static str, device: Option<DeviceId>, ptr: DevicePtr) -> Result<()> {
    let mut reg = registry();
    let found = reg.allocations.get(&ptr).copied();
    let Some(a) = found.filter(|a| a.device.is_some() == device.is_some()) else {
        return Err(err(
            api,
            Code::InvalidValue,
            Some(format!("0x{ptr:x} is not a live allocation of this kind")),
        ));
    };
    reg.allocations.remove(&ptr);
    if let Some(dev) = a.device {
        reg.used[dev as usize] -= a.size;
    }
    drop(reg);
    let layout = layout_of(a.size).expect("the layout was valid at allocation");
    // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` with this layout (`layout_of` of the
    // same size) and is freed once: it
    // was just removed from the registry under its lock.
    unsafe { dealloc(ptr as *mut u8, layout) };
    Ok(())
}

/// The device of a pointer into a live device allocation; `None` for pinned or unknown memory.
pub(crate) fn device_of(ptr: DevicePtr) -> Option<DeviceId> {
    let reg = registry();
    let (&start, a) = reg.allocations.range(..=ptr).next_back()?;
    if ptr < start + a.size {
        a.device
    } else {
        None
    }
}

/// Bytes allocated on a device.
pub(crate) fn used(dev: usize) -> usize {
    registry().used[dev]
}

/// The simulated stream-ordered pool of one device: what `cuMemAllocAsync`'s default pool does,
/// in the terms its attributes report. Freed blocks stay cached (reused for a request of the same
/// size) while the pool holds no more than its release threshold; above it, cached blocks go back
/// at once when a stream reaches their free (the driver waits for a synchronisation). The
/// threshold starts at `u64::MAX`, where the GPU backends set it on first use.
struct AsyncPool {
    device: DeviceId,
    /// Lent blocks by address, with their sizes.
    live: HashMap<DevicePtr, usize>,
    /// Freed blocks the pool keeps, as `(address, size)`.
    cached: Vec<(DevicePtr, usize)>,
    used: usize,
    reserved: usize,
    threshold: u64,
}

impl AsyncPool {
    /// Releases cached blocks until the pool holds at most `keep` bytes (or has none cached).
    fn release_down_to(&mut self, keep: u64) {
        while self.reserved as u64 > keep {
            let Some((ptr, size)) = self.cached.pop() else { break };
            self.reserved -= size;
            // A cached block is a live device allocation of this pool, released once: it was just
            // taken off the cache.
            let _ = release("cuMemPoolTrimTo", Some(self.device), ptr);
        }
    }
}

fn async_pools() -> MutexGuard<'static, Vec<AsyncPool>> {
    static P: OnceLock<Mutex<Vec<AsyncPool>>> = OnceLock::new();
    P.get_or_init(|| {
        Mutex::new(
            (0..device_count())
                .map(|i| AsyncPool {
                    device: i as DeviceId,
                    live: HashMap::new(),
                    cached: Vec::new(),
                    used: 0,
                    reserved: 0,
                    threshold: u64::MAX,
                })
                .collect(),
        )
    })
    .lock()
    .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MemoryOps for Host {
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        allocate("cuMemAlloc", Some(dev), size)
    }
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        // No wait here, unlike cudaFree: the contract says no queued work uses the memory, and
        // the typed layer frees only memory its queued work no longer keeps alive. (Waiting for
        // every stream of the device could wait for the freeing thread itself.)
        release("cuMemFree", Some(dev), ptr)
    }
    fn malloc_host(_dev: DeviceId, size: usize) -> Result<*mut u8> {
        allocate("cuMemHostAlloc", None, size).map(|p| p as *mut u8)
    }
    unsafe fn free_host(_dev: DeviceId, ptr: *mut u8) -> Result<()> {
        // No wait, as for `free`.
        release("cuMemFreeHost", None, ptr as DevicePtr)
    }
    unsafe fn malloc_async(dev: DeviceId, size: usize, _stream: HostStream) -> Result<DevicePtr> {
        let i = check_device("cuMemAllocAsync", dev)?;
        let mut pools = async_pools();
        let pool = &mut pools[i];
        // Memory freed earlier is reused for a request of its size: its free was ordered after
        // all its uses on the freeing stream, which had reached the free (it is in the cache).
        let ptr = match pool.cached.iter().position(|&(_, s)| s == size) {
            Some(at) => pool.cached.swap_remove(at).0,
            None => {
                let ptr = allocate("cuMemAllocAsync", Some(dev), size)?;
                pool.reserved += size;
                ptr
            }
        };
        pool.used += size;
        pool.live.insert(ptr, size);
        Ok(ptr)
    }
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HostStream) -> Result<()> {
        let i = check_device("cuMemFreeAsync", dev)?;
        enqueue(
            "cuMemFreeAsync",
            dev,
            stream,
            Arc::new(move || {
                // Ordered after the stream's earlier work, which is all that may use it. A replay
                // of a graph that captured the free finds the block gone and does nothing.
                let mut pools = async_pools();
                let pool = &mut pools[i];
                if let Some(size) = pool.live.remove(&ptr) {
                    pool.used -= size;
                    pool.cached.push((ptr, size));
                    let keep = pool.threshold;
                    pool.release_down_to(keep);
                }
            }),
        )
    }
    fn async_pool_attribute(dev: DeviceId, attribute: AsyncPoolAttribute) -> Result<u64> {
        let i = check_device("cuMemPoolGetAttribute", dev)?;
        let pools = async_pools();
        let pool = &pools[i];
        Ok(match attribute {
            AsyncPoolAttribute::ReleaseThreshold => pool.threshold,
            AsyncPoolAttribute::ReservedCurrent => pool.reserved as u64,
            AsyncPoolAttribute::UsedCurrent => pool.used as u64,
        })
    }
    fn async_pool_set_release_threshold(dev: DeviceId, bytes: u64) -> Result<()> {
        let i = check_device("cuMemPoolSetAttribute", dev)?;
        async_pools()[i].threshold = bytes;
        Ok(())
    }
    fn async_pool_trim_to(dev: DeviceId, keep: usize) -> Result<()> {
        let i = check_device("cuMemPoolTrimTo", dev)?;
        async_pools()[i].release_down_to(keep as u64);
        Ok(())
    }
    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        join_legacy(dev, "cuMemcpy")?;
        // SAFETY: the caller guarantees both ranges are valid and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        Ok(())
    }
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: HostStream,
    ) -> Result<()> {
        enqueue(
            "cuMemcpyAsync",
            dev,
            stream,
            Arc::new(move || {
                // SAFETY: the caller guarantees both ranges stay valid and disjoint until the
                // stream reaches this copy (and every replay of a graph that captured it).
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
            }),
        )
    }
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        join_legacy(dev, "cuMemsetD8")?;
        // SAFETY: the caller guarantees the range is valid.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        Ok(())
    }
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: HostStream,
    ) -> Result<()> {
        enqueue(
            "cuMemsetD8Async",
            dev,
            stream,
            Arc::new(move || {
                // SAFETY: the caller guarantees the range stays valid until the stream reaches
                // this memset (and every replay).
                unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
            }),
        )
    }
    /// Device memory is host memory: staging a copy through pinned buffers only adds a copy.
    fn stages_pageable_copies() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F5: a zero-size allocation never asks the global allocator for zero bytes (Miri reports
    /// that as undefined behaviour), has an address of its own, and frees.
    #[test]
    fn zero_size_allocations_have_distinct_addresses_and_free() {
        let a = Host::malloc(0, 0).unwrap();
        let b = Host::malloc(0, 0).unwrap();
        assert_ne!(a, 0);
        assert_ne!(a, b);
        assert_eq!(a % ALIGN, 0);
        let pinned = Host::malloc_host(0, 0).unwrap();
        assert!(!pinned.is_null());
        // SAFETY: each pointer was just allocated by this backend, of this kind, and is freed once.
        unsafe {
            Host::free(0, a).unwrap();
            Host::free(0, b).unwrap();
            Host::free_host(0, pinned).unwrap();
        }
    }
}
