//! Virtual memory on the host backend, simulated so that code built on it (expandable segments)
//! runs and is tested on any machine.
//!
//! A reserved range is one zeroed host allocation of its whole size (the operating system commits
//! its pages only when touched, so reserving much costs little). Physical memory is a counted
//! handle whose bytes count against the device's capacity; mapping records which granules of
//! which range a handle covers, and the simulation checks every rule the CUDA driver checks:
//! granule-aligned sizes and addresses, mappings inside a live range that do not overlap, access
//! set only on mapped memory, unmapping whole mappings, no range freed while mapped. Bytes are not
//! cleared on unmapping (touching them would commit the pages): memory mapped again reads what
//! was there, as fresh device memory reads something undefined.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DevicePtr, PhysicalHandle, VirtualMemoryOps};

use super::memory::{capacity_checked, check_device};
use super::result::{err, Code};
use super::Host;

/// The granule: 2 MiB, as CUDA's on current GPUs.
pub(crate) const GRANULE: usize = 2 << 20;

struct Range {
    dev: DeviceId,
    size: usize,
    /// The host allocation the range lies in (it starts at most a granule below the range).
    allocation: DevicePtr,
    /// Mappings by offset: (length, handle, devices with access).
    mapped: BTreeMap<usize, (usize, PhysicalHandle, Vec<DeviceId>)>,
}

struct Physical {
    dev: DeviceId,
    size: usize,
    released: bool,
    mapped: bool,
    /// The thread that created it, so that a test counts its own memory only (tests run at once
    /// in one process and share this simulated device).
    #[cfg(test)]
    creator: std::thread::ThreadId,
}

#[derive(Default)]
struct Vm {
    ranges: BTreeMap<DevicePtr, Range>,
    physical: HashMap<PhysicalHandle, Physical>,
    next_handle: PhysicalHandle,
    /// Physical bytes per device.
    used: HashMap<DeviceId, usize>,
}

fn vm() -> MutexGuard<'static, Vm> {
    static VM: OnceLock<Mutex<Vm>> = OnceLock::new();
    VM.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The devices with access to the mapping that holds `ptr`; `None` where nothing is mapped.
#[cfg(test)]
pub(crate) fn access_of(ptr: DevicePtr) -> Option<Vec<DeviceId>> {
    let vm = vm();
    let (&base, range) = vm.ranges.range(..=ptr).next_back()?;
    let offset = ptr - base;
    let (&at, (len, _, devices)) = range.mapped.range(..=offset).next_back()?;
    (offset < at + len).then(|| devices.clone())
}

fn invalid(api: &'static str, what: String) -> Error {
    err(api, Code::InvalidValue, Some(what))
}

fn check_granules(api: &'static str, size: usize) -> Result<()> {
    if size == 0 || !size.is_multiple_of(GRANULE) {
        return Err(invalid(
            api,
            format!("size {size} is not a positive multiple of the granule ({GRANULE})"),
        ));
    }
    Ok(())
}

/// The host allocation behind a reserved range of `size` bytes: one granule more than the range,
/// so that the range can start on a granule, with a small alignment. (A large alignment would
/// make the allocator write the zeroes itself, committing every page; a small one gets pages the
/// operating system zeroes when first touched.)
fn host_layout(size: usize) -> Result<Layout> {
    size.checked_add(GRANULE)
        .and_then(|n| Layout::from_size_align(n, 16).ok())
        .ok_or(Error::OutOfMemory { size, total: None })
}

/// The range holding `ptr..ptr + size`, and the offset of `ptr` in it.
fn range_of<'a>(
    vm: &'a mut Vm,
    api: &'static str,
    ptr: DevicePtr,
    size: usize,
) -> Result<(DevicePtr, usize, &'a mut Range)> {
    let outside = || invalid(api, format!("0x{ptr:x}+{size} is not inside a reserved range"));
    let (&base, range) = vm.ranges.range_mut(..=ptr).next_back().ok_or_else(outside)?;
    let offset = ptr - base;
    if offset.checked_add(size).is_none_or(|end| end > range.size) {
        return Err(outside());
    }
    if !offset.is_multiple_of(GRANULE) {
        return Err(invalid(api, format!("0x{ptr:x} is not aligned to the granule")));
    }
    Ok((base, offset, range))
}

/// The mappings of `range` that cover `offset..offset + size` exactly, as their offsets.
fn whole_mappings(api: &'static str, range: &Range, offset: usize, size: usize) -> Result<Vec<usize>> {
    let mut at = offset;
    let mut found = Vec::new();
    for (&o, &(len, _, _)) in range.mapped.range(offset..offset + size) {
        if o != at {
            break;
        }
        found.push(o);
        at = o + len;
    }
    if at != offset + size {
        return Err(invalid(api, format!("offset {offset}+{size} is not covered by whole mappings")));
    }
    Ok(found)
}

impl VirtualMemoryOps for Host {
    fn vm_granularity(dev: DeviceId) -> Result<usize> {
        check_device("cuMemGetAllocationGranularity", dev)?;
        Ok(GRANULE)
    }

    fn vm_reserve(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        const API: &str = "cuMemAddressReserve";
        check_device(API, dev)?;
        check_granules(API, size)?;
        // The simulation backs a reserved range with host memory, so a range larger than the
        // device's memory (which no mapping could fill) is refused before it is allocated.
        let capacity = super::memory::capacity_checked()?;
        if size > capacity {
            return Err(Error::OutOfMemory { size, total: None });
        }
        let layout = host_layout(size)?;
        // SAFETY: the size is not 0 (checked above) and the alignment is a power of two.
        let allocation = unsafe { alloc_zeroed(layout) };
        if allocation.is_null() {
            return Err(Error::OutOfMemory { size, total: None });
        }
        let ptr = (allocation as DevicePtr).next_multiple_of(GRANULE);
        vm().ranges
            .insert(ptr, Range { dev, size, allocation: allocation as DevicePtr, mapped: BTreeMap::new() });
        Ok(ptr)
    }

    unsafe fn vm_free_range(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        const API: &str = "cuMemAddressFree";
        let mut vm = vm();
        match vm.ranges.get(&ptr) {
            Some(r) if r.size == size && r.dev == dev && r.mapped.is_empty() => {}
            Some(r) if !r.mapped.is_empty() => {
                return Err(err(API, Code::IllegalState, Some(format!("0x{ptr:x} still has mappings"))));
            }
            _ => {
                return Err(invalid(API, format!("0x{ptr:x}+{size} is not a reserved range of device {dev}")))
            }
        }
        let range = vm.ranges.remove(&ptr).expect("found above");
        drop(vm);
        let layout = host_layout(size).expect("the layout was valid when reserved");
        // SAFETY: `range.allocation` came from `alloc_zeroed(layout)` in `vm_reserve` for this
        // size, and the range was just removed from the registry under its lock: freed once.
        unsafe { dealloc(range.allocation as *mut u8, layout) };
        Ok(())
    }

    fn vm_create(dev: DeviceId, size: usize) -> Result<PhysicalHandle> {
        const API: &str = "cuMemCreate";
        count_call(0);
        check_device(API, dev)?;
        check_granules(API, size)?;
        let capacity = capacity_checked()?;
        let mut vm = vm();
        let used = vm.used.entry(dev).or_default();
        if used.checked_add(size).is_none_or(|u| u > capacity) {
            return Err(Error::OutOfMemory { size, total: None });
        }
        *used += size;
        vm.next_handle += 1;
        let handle = vm.next_handle;
        vm.physical.insert(
            handle,
            Physical {
                dev,
                size,
                released: false,
                mapped: false,
                #[cfg(test)]
                creator: std::thread::current().id(),
            },
        );
        Ok(handle)
    }

    unsafe fn vm_release(dev: DeviceId, handle: PhysicalHandle) -> Result<()> {
        let mut vm = vm();
        let Some(p) = vm.physical.get_mut(&handle).filter(|p| !p.released && p.dev == dev) else {
            return Err(err("cuMemRelease", Code::InvalidHandle, Some(format!("handle {handle}"))));
        };
        p.released = true;
        if !p.mapped {
            let size = p.size;
            vm.physical.remove(&handle);
            *vm.used.entry(dev).or_default() -= size;
        }
        Ok(())
    }

    unsafe fn vm_map(dev: DeviceId, ptr: DevicePtr, size: usize, handle: PhysicalHandle) -> Result<()> {
        const API: &str = "cuMemMap";
        count_call(1);
        let mut vm = vm();
        match vm.physical.get(&handle) {
            Some(p) if !p.released && !p.mapped && p.size == size && p.dev == dev => {}
            _ => {
                return Err(err(API, Code::InvalidHandle, Some(format!("handle {handle} for {size} bytes"))))
            }
        }
        let (_, offset, range) = range_of(&mut vm, API, ptr, size)?;
        let overlaps = range
            .mapped
            .range(..offset + size)
            .next_back()
            .is_some_and(|(&o, &(len, _, _))| o + len > offset);
        if overlaps {
            return Err(invalid(API, format!("0x{ptr:x}+{size} overlaps a mapping")));
        }
        range.mapped.insert(offset, (size, handle, Vec::new()));
        vm.physical.get_mut(&handle).expect("checked above").mapped = true;
        Ok(())
    }

    unsafe fn vm_set_access(dev: DeviceId, ptr: DevicePtr, size: usize, devices: &[DeviceId]) -> Result<()> {
        const API: &str = "cuMemSetAccess";
        count_call(2);
        for &d in devices {
            check_device(API, d)?;
        }
        let mut vm = vm();
        let (_, offset, range) = range_of(&mut vm, API, ptr, size)?;
        if range.dev != dev {
            return Err(invalid(API, format!("0x{ptr:x} is not device {dev}'s")));
        }
        for o in whole_mappings(API, range, offset, size)? {
            range.mapped.get_mut(&o).expect("found above").2 = devices.to_vec();
        }
        Ok(())
    }

    unsafe fn vm_unmap(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        const API: &str = "cuMemUnmap";
        count_call(3);
        let mut vm = vm();
        let (_, offset, range) = range_of(&mut vm, API, ptr, size)?;
        if range.dev != dev {
            return Err(invalid(API, format!("0x{ptr:x} is not device {dev}'s")));
        }
        let mut handles = Vec::new();
        for o in whole_mappings(API, range, offset, size)? {
            handles.push(range.mapped.remove(&o).expect("found above").1);
        }
        for h in handles {
            let p = vm.physical.get_mut(&h).expect("a mapped handle is known");
            p.mapped = false;
            if p.released {
                let size = p.size;
                vm.physical.remove(&h);
                *vm.used.entry(dev).or_default() -= size;
            }
        }
        Ok(())
    }
}

/// The driver calls that make and unmap memory on this thread, for the pool's tests (which count
/// what a growth costs): `[create, map, set access, unmap]`. Per thread, so that tests running
/// at once do not see each other's calls.
#[cfg(test)]
pub(crate) fn calls_on_this_thread() -> [usize; 4] {
    CALLS.with(std::cell::Cell::get)
}

#[cfg(test)]
thread_local! {
    static CALLS: std::cell::Cell<[usize; 4]> = const { std::cell::Cell::new([0; 4]) };
}

#[inline]
fn count_call(which: usize) {
    #[cfg(test)]
    CALLS.with(|c| {
        let mut n = c.get();
        n[which] += 1;
        c.set(n);
    });
    #[cfg(not(test))]
    let _ = which;
}

/// Physical bytes the calling thread created on device `dev` that are not yet gone (for tests:
/// per thread, as [`calls_on_this_thread`], since the whole device's count moves with the tests
/// running beside).
#[cfg(test)]
pub(crate) fn physical_bytes_made_here(dev: DeviceId) -> usize {
    let me = std::thread::current().id();
    vm().physical.values().filter(|p| p.dev == dev && p.creator == me).map(|p| p.size).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_larger_than_the_device_is_refused_before_it_is_allocated() {
        let capacity = super::super::memory::capacity_checked().unwrap();
        let size = (capacity + 1).next_multiple_of(GRANULE);
        let err = Host::vm_reserve(0, size).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { size: s, .. } if s == size), "{err:?}");
        // A range that fits is still lent, and freed.
        let ptr = Host::vm_reserve(0, GRANULE).unwrap();
        // SAFETY: reserved just above with this size; nothing is mapped in it.
        unsafe { Host::vm_free_range(0, ptr, GRANULE) }.unwrap();
    }
}
