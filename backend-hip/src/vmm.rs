//! Virtual memory: `hipMemAddressReserve`, `hipMemCreate`, `hipMemMap`, `hipMemSetAccess` and
//! their inverses, which every runtime this crate loads exports (they came in HIP 5.1; Debian's
//! 5.2.3 library has each). Mirrors the CUDA backend's `vmm.rs`: physical memory is pinned
//! device memory of the device's ordinal, with no shareable handle.
//!
//! Differs from the CUDA backend:
//!
//! - **The properties' layout changed in HIP 5.3.** HIP 5.1 and 5.2 declare
//!   `hipMemAllocationProp` as `{compressionType, location, requestedHandleType, type, usage,
//!   win32HandleMetaData}`; from 5.3 on (ROCm 6 included) it has CUDA's layout, which hip-sys's
//!   bindings (generated from 5.4's headers) declare. Both are built here, and the runtime's
//!   version (`hipRuntimeGetVersion`) picks the one it reads.
//! - **A runtime may export the entry points and still not offer them**: `hipErrorNotSupported`
//!   from any of them is [`Error::Unsupported`](gpumem_core::Error::Unsupported), so a caller
//!   that asked for virtual memory by default (the C ABI) falls back to plain allocations.
//! - The physical handle is a pointer (`hipMemGenericAllocationHandle_t`), carried as its
//!   address in [`PhysicalHandle`].
//!
//! None of this has run on AMD hardware; it runs on NVIDIA GPUs through the HIP-on-CUDA shim
//! (`scripts/hip-on-cuda/`), with the 5.2 layout the shim reports.

use std::ffi::{c_uint, c_void};
use std::ptr;

use gpumem_core::{DeviceId, DevicePtr, PhysicalHandle, Result, VirtualMemoryOps};
use hip_sys::hiprt::{
    hipMemAccessDesc, hipMemAccessFlags, hipMemAllocationGranularity_flags, hipMemAllocationHandleType,
    hipMemAllocationProp, hipMemAllocationProp__bindgen_ty_1, hipMemAllocationType, hipMemLocation,
    hipMemLocationType,
};

use crate::device::{make_current, runtime_version};
use crate::memory::dptr;
use crate::result::{self, check_alloc, sys, Code, ERROR_NOT_SUPPORTED, SUCCESS};
use crate::Hip;

/// `hipMemAllocationProp` as HIP 5.1 and 5.2 declare it (Debian's `hip_runtime_api.h`, 5.2.3).
#[repr(C)]
struct PropertiesV5_2 {
    compression_type: u8,
    location: hipMemLocation,
    requested_handle_type: hipMemAllocationHandleType,
    type_: hipMemAllocationType,
    usage: u16,
    win32_handle_meta_data: *mut c_void,
}

/// The allocation properties in the layout the loaded runtime reads.
enum Properties {
    /// HIP 5.1 and 5.2.
    V5_2(PropertiesV5_2),
    /// HIP 5.3 and later: CUDA's layout.
    Current(hipMemAllocationProp),
}

impl Properties {
    /// Pinned device memory on `dev`, no shareable handle, no compression, in the layout of a
    /// runtime of version `version` (major, minor).
    fn of(dev: DeviceId, version: (i32, i32)) -> Properties {
        if version < (5, 3) {
            Properties::V5_2(PropertiesV5_2 {
                compression_type: 0,
                location: location(dev),
                requested_handle_type: hipMemAllocationHandleType::hipMemHandleTypeNone,
                type_: hipMemAllocationType::hipMemAllocationTypePinned,
                usage: 0,
                win32_handle_meta_data: ptr::null_mut(),
            })
        } else {
            Properties::Current(hipMemAllocationProp {
                type_: hipMemAllocationType::hipMemAllocationTypePinned,
                requestedHandleType: hipMemAllocationHandleType::hipMemHandleTypeNone,
                location: location(dev),
                win32HandleMetaData: ptr::null_mut(),
                allocFlags: hipMemAllocationProp__bindgen_ty_1::default(),
            })
        }
    }

    /// For the loaded runtime.
    fn for_runtime(dev: DeviceId) -> Properties {
        Properties::of(dev, runtime_version())
    }

    /// The pointer the runtime takes; valid while `self` lives.
    fn as_ptr(&self) -> *const c_void {
        match self {
            Properties::V5_2(p) => ptr::from_ref(p).cast(),
            Properties::Current(p) => ptr::from_ref(p).cast(),
        }
    }
}

/// Where memory of device `dev` lives.
fn location(dev: DeviceId) -> hipMemLocation {
    hipMemLocation { type_: hipMemLocationType::hipMemLocationTypeDevice, id: dev }
}

/// `Ok(())` for success; `hipErrorNotSupported` is `Unsupported`; else the mapped error.
fn check_vm(api: &'static str, code: Code) -> Result<()> {
    match code {
        SUCCESS => Ok(()),
        ERROR_NOT_SUPPORTED => Err(result::unsupported("virtual memory")),
        _ => Err(result::error(api, code)),
    }
}

/// As [`check_vm`], for an allocation of `size` bytes (out of memory is `OutOfMemory`).
fn check_vm_alloc(api: &'static str, code: Code, size: usize) -> Result<()> {
    match code {
        ERROR_NOT_SUPPORTED => Err(result::unsupported("virtual memory")),
        _ => check_alloc(api, code, size),
    }
}

impl VirtualMemoryOps for Hip {
    fn vm_granularity(dev: DeviceId) -> Result<usize> {
        make_current(dev)?;
        let prop = Properties::for_runtime(dev);
        let mut granularity = 0usize;
        let option = hipMemAllocationGranularity_flags::hipMemAllocationGranularityRecommended as c_uint;
        // SAFETY: both pointers are valid for the call; `prop` is fully initialised in the
        // layout this runtime reads.
        check_vm("hipMemGetAllocationGranularity", unsafe {
            sys::hipMemGetAllocationGranularity(&mut granularity, prop.as_ptr(), option)
        })?;
        Ok(granularity)
    }

    fn vm_reserve(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        make_current(dev)?;
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; alignment 0 is the granule; no fixed address.
        let r = unsafe { sys::hipMemAddressReserve(&mut ptr, size, 0, ptr::null_mut(), 0) };
        check_vm_alloc("hipMemAddressReserve", r, size)?;
        Ok(ptr as DevicePtr)
    }

    unsafe fn vm_free_range(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees a reserved range with nothing mapped, freed once.
        check_vm("hipMemAddressFree", unsafe { sys::hipMemAddressFree(dptr(ptr), size) })
    }

    fn vm_create(dev: DeviceId, size: usize) -> Result<PhysicalHandle> {
        make_current(dev)?;
        let prop = Properties::for_runtime(dev);
        let mut handle: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer and properties in the runtime's layout; flags must be 0.
        let r = unsafe { sys::hipMemCreate(&mut handle, size, prop.as_ptr(), 0) };
        check_vm_alloc("hipMemCreate", r, size)?;
        Ok(handle as usize as PhysicalHandle)
    }

    unsafe fn vm_release(dev: DeviceId, handle: PhysicalHandle) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees a handle from `vm_create` (a pointer the runtime gave,
        // carried as its address), released once.
        check_vm("hipMemRelease", unsafe { sys::hipMemRelease(handle as usize as *mut c_void) })
    }

    unsafe fn vm_map(dev: DeviceId, ptr: DevicePtr, size: usize, handle: PhysicalHandle) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees an unmapped part of a live reserved range and a handle of
        // `size` bytes; offset and flags are 0.
        check_vm("hipMemMap", unsafe {
            sys::hipMemMap(dptr(ptr), size, 0, handle as usize as *mut c_void, 0)
        })
    }

    unsafe fn vm_set_access(dev: DeviceId, ptr: DevicePtr, size: usize, devices: &[DeviceId]) -> Result<()> {
        make_current(dev)?;
        let descs: Vec<hipMemAccessDesc> = devices
            .iter()
            .map(|&d| hipMemAccessDesc {
                location: location(d),
                flags: hipMemAccessFlags::hipMemAccessFlagsProtReadWrite,
            })
            .collect();
        // SAFETY: the caller guarantees a mapped range; `descs` holds `descs.len()` descriptors.
        check_vm("hipMemSetAccess", unsafe {
            sys::hipMemSetAccess(dptr(ptr), size, descs.as_ptr(), descs.len())
        })
    }

    unsafe fn vm_unmap(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees whole mappings that no pending work uses.
        check_vm("hipMemUnmap", unsafe { sys::hipMemUnmap(dptr(ptr), size) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The two layouts, field by field, as HIP 5.2's and 5.3's headers place them on x86-64.
    #[test]
    fn the_properties_have_each_headers_layout() {
        assert_eq!(offset_of!(PropertiesV5_2, compression_type), 0);
        assert_eq!(offset_of!(PropertiesV5_2, location), 4);
        assert_eq!(offset_of!(PropertiesV5_2, requested_handle_type), 12);
        assert_eq!(offset_of!(PropertiesV5_2, type_), 16);
        assert_eq!(offset_of!(PropertiesV5_2, usage), 20);
        assert_eq!(offset_of!(PropertiesV5_2, win32_handle_meta_data), 24);
        assert_eq!(size_of::<PropertiesV5_2>(), 32);

        assert_eq!(offset_of!(hipMemAllocationProp, type_), 0);
        assert_eq!(offset_of!(hipMemAllocationProp, requestedHandleType), 4);
        assert_eq!(offset_of!(hipMemAllocationProp, location), 8);
        assert_eq!(offset_of!(hipMemAllocationProp, win32HandleMetaData), 16);
        assert_eq!(offset_of!(hipMemAllocationProp, allocFlags), 24);
        assert_eq!(size_of::<hipMemAllocationProp>(), 32);
    }

    /// The runtime's version picks the layout: 5.1 and 5.2 the old one, 5.3 on CUDA's.
    #[test]
    fn the_runtime_version_picks_the_layout() {
        for (version, old) in
            [((5, 1), true), ((5, 2), true), ((5, 3), false), ((5, 7), false), ((6, 0), false)]
        {
            let prop = Properties::of(3, version);
            match prop {
                Properties::V5_2(p) => {
                    assert!(old, "{version:?}");
                    assert_eq!(p.location.id, 3);
                }
                Properties::Current(p) => {
                    assert!(!old, "{version:?}");
                    assert_eq!(p.location.id, 3);
                }
            }
        }
    }
}
