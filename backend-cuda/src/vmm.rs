//! Virtual memory: `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess` and their
//! inverses, in every driver of CUDA 10.2 and later (so in every driver the 12.0 bindings load).
//! Physical memory is pinned device memory of the device's ordinal, with no shareable handle.

use std::ptr;

use crate::sys::{self, CUdeviceptr};
use gpumem_core::{DeviceId, DevicePtr, PhysicalHandle, Result, VirtualMemoryOps};

use crate::device::make_current;
use crate::result::{check, check_alloc};
use crate::Cuda;

/// Where memory of device `dev` lives.
fn location(dev: DeviceId) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: dev }
}

/// Pinned device memory on `dev`, no shareable handle, no compression.
fn properties(dev: DeviceId) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CU_MEM_HANDLE_TYPE_NONE,
        location: location(dev),
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocFlags {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

impl VirtualMemoryOps for Cuda {
    fn vm_granularity(dev: DeviceId) -> Result<usize> {
        make_current(dev)?;
        let prop = properties(dev);
        let mut granularity = 0usize;
        let flag = sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
        // SAFETY: both pointers are valid for the call; `prop` is fully initialised.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(&mut granularity, &prop, flag)
        })?;
        Ok(granularity)
    }

    fn vm_reserve(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        make_current(dev)?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; alignment 0 is the granule; no fixed address.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) };
        check_alloc("cuMemAddressReserve", r, size)?;
        Ok(ptr as DevicePtr)
    }

    unsafe fn vm_free_range(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees a reserved range with nothing mapped, freed once.
        check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr as CUdeviceptr, size) })
    }

    fn vm_create(dev: DeviceId, size: usize) -> Result<PhysicalHandle> {
        make_current(dev)?;
        let prop = properties(dev);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; flags must be 0.
        check_alloc("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }, size)?;
        Ok(handle)
    }

    unsafe fn vm_release(dev: DeviceId, handle: PhysicalHandle) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees a handle from `vm_create`, released once.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }

    unsafe fn vm_map(dev: DeviceId, ptr: DevicePtr, size: usize, handle: PhysicalHandle) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees an unmapped part of a live reserved range and a handle of
        // `size` bytes; offset and flags are 0.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr as CUdeviceptr, size, 0, handle, 0) })
    }

    unsafe fn vm_set_access(dev: DeviceId, ptr: DevicePtr, size: usize, devices: &[DeviceId]) -> Result<()> {
        make_current(dev)?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&d| sys::CUmemAccessDesc {
                location: location(d),
                flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the caller guarantees a mapped range; `descs` holds `descs.len()` descriptors.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr as CUdeviceptr, size, descs.as_ptr(), descs.len())
        })
    }

    unsafe fn vm_unmap(dev: DeviceId, ptr: DevicePtr, size: usize) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the caller guarantees whole mappings that no pending work uses.
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr as CUdeviceptr, size) })
    }
}
