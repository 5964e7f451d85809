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
use crate::hal::{DeviceId, DevicePtr, MemoryOps};

use super::result::{err, Code};
use super::worker::join_legacy;
use super::{enqueue, Host, HostStream};

/// The alignment of host allocations: the pool's unit, more than CUDA's 256 bytes.
const ALIGN: usize = 512;
const DEFAULT_DEVICES: usize = 2;
const DEFAULT_CAPACITY: usize = 16 << 30;

/// The number of simulated devices: `GPUMEM_HOST_DEVICES` (1 to 64), default 2, so multi-device
/// code paths run on any machine.
pub(crate) fn device_count() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("GPUMEM_HOST_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(DEFAULT_DEVICES, |n| n.clamp(1, 64))
    })
}

/// Each simulated device's memory in bytes.
pub(crate) fn capacity() -> usize {
    static C: OnceLock<usize> = OnceLock::new();
    *C.get_or_init(|| {
        std::env::var("GPUMEM_HOST_DEVICE_MEMORY")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_CAPACITY)
    })
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
    match usize::try_from(dev) {
        Ok(i) if i < device_count() => Ok(i),
        _ => Err(err(api, Code::InvalidDevice, Some(format!("device {dev}")))),
    }
}

/// Allocates `size > 0` zeroed bytes, for `device` (`None`: pinned host memory).
pub(crate) fn allocate(api: &'static str, device: Option<DeviceId>, size: usize) -> Result<DevicePtr> {
    let layout =
        Layout::from_size_align(size, ALIGN).map_err(|_| Error::OutOfMemory { size, total: None })?;
    let mut reg = registry();
    if let Some(dev) = device {
        let i = check_device(api, dev)?;
        if reg.used[i].checked_add(size).is_none_or(|u| u > capacity()) {
            return Err(Error::OutOfMemory { size, total: None });
        }
        reg.used[i] += size;
    }
    // SAFETY: `layout` has a non-zero size (callers pass `size > 0`) and a valid alignment.
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
    let layout = Layout::from_size_align(a.size, ALIGN).expect("the layout was valid at allocation");
    // SAFETY: `ptr` was returned by `alloc_zeroed(layout)` with this layout and is freed once: it
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
        allocate("cuMemAllocAsync", Some(dev), size)
    }
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HostStream) -> Result<()> {
        enqueue(
            "cuMemFreeAsync",
            dev,
            stream,
            Arc::new(move || {
                // Ordered after the stream's earlier work, which is all that may use it.
                let _ = release("cuMemFreeAsync", Some(dev), ptr);
            }),
        )
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
