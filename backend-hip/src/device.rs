//! Devices: enumeration, the calling thread's current device, properties, memory information,
//! synchronisation, peer access and pointer queries.
//!
//! Differs from the CUDA backend, which retains each device's primary context and keeps a table
//! of device handles: HIP has one implicit context per device, selected per thread with
//! `hipSetDevice`, and takes device ordinals directly, so there is no handle or context to keep.
//! The per-device state of the stream-ordered allocator lives in `memory`.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use gpumem_core::{DeviceId, DeviceOps, DeviceProperties, DevicePtr, MemInfo, Result};
use hip_sys::hiprt::hipDeviceAttribute_t;

use crate::result::{self, check, sys, ERROR_INVALID_VALUE, ERROR_PEER_ACCESS_ALREADY_ENABLED, SUCCESS};
use crate::Hip;

thread_local! {
    /// The device gpumem last made current on this thread. `hipSetDevice` is called only when an
    /// operation needs another one.
    static CURRENT: Cell<Option<DeviceId>> = const { Cell::new(None) };
}

/// Makes `dev` HIP's current device for the calling thread and remembers it.
fn set_current(dev: DeviceId) -> Result<()> {
    // SAFETY: takes an integer, which the runtime checks.
    check("hipSetDevice", unsafe { sys::hipSetDevice(dev) })?;
    // At thread exit the cache may be gone; the next call then sets the device again.
    let _ = CURRENT.try_with(|c| c.set(Some(dev)));
    Ok(())
}

/// Makes `dev` the calling thread's current device, unless this thread's cache says it already
/// is. Every operation that runs on a device calls this first; it also runs the once-only
/// runtime check, so without a device every operation answers `NoDevice`.
///
/// # Errors
///
/// `NoDevice`; the runtime's error for an unknown device.
pub(crate) fn make_current(dev: DeviceId) -> Result<()> {
    if matches!(CURRENT.try_with(|c| c.get() == Some(dev)), Ok(true)) {
        return Ok(());
    }
    result::init()?;
    set_current(dev)
}

/// One integer attribute of a device.
///
/// # Errors
///
/// The runtime's error.
pub(crate) fn attribute(dev: DeviceId, attribute: hipDeviceAttribute_t) -> Result<i32> {
    let mut value: c_int = 0;
    // SAFETY: `value` is a valid out-pointer; `attribute` is a variant of hip-sys's enum, so a
    // value the C enum has (the numbers used here are the same in HIP 5.4, which hip-sys was
    // generated from, and in 5.2's headers).
    check("hipDeviceGetAttribute", unsafe { sys::hipDeviceGetAttribute(&mut value, attribute, dev) })?;
    Ok(value)
}

/// An attribute the runtime may not know: HIP answers `hipErrorInvalidValue` for an attribute
/// it was built without (HIP 5's runtimes add them release by release); `None` then. The CUDA
/// backend needs no such case: every attribute it reads exists in CUDA 12.0.
///
/// # Errors
///
/// The runtime's error.
fn optional_attribute(dev: DeviceId, attr: hipDeviceAttribute_t) -> Result<Option<i32>> {
    match attribute(dev, attr) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code() == Some(i64::from(ERROR_INVALID_VALUE)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `dev` has a stream-ordered allocator (`hipDeviceAttributeMemoryPoolsSupported`); a
/// runtime that does not know the attribute has none to offer.
///
/// # Errors
///
/// The runtime's error.
pub(crate) fn memory_pools_supported(dev: DeviceId) -> Result<bool> {
    let supported = optional_attribute(dev, hipDeviceAttribute_t::hipDeviceAttributeMemoryPoolsSupported)?;
    Ok(supported.is_some_and(|v| v != 0))
}

/// The runtime's version as (major, minor) (`HIP_VERSION` is major * 10^7 + minor * 10^5 +
/// patch), read once; HIP 5.2, the version this crate was written against, where it cannot be
/// read.
pub(crate) fn runtime_version() -> (i32, i32) {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer.
        match unsafe { sys::hipRuntimeGetVersion(&mut version) } {
            SUCCESS if version > 0 => (version / 10_000_000, version / 100_000 % 100),
            _ => (5, 2),
        }
    })
}

/// The runtime's major version (see [`runtime_version`]).
fn runtime_major() -> i32 {
    runtime_version().0
}

/// Whether a pointer's memory type, as a runtime of major version `major` numbers
/// `hipMemoryType`, is host memory. ROCm 6 renumbered the enum to CUDA's values.
fn is_host_memory(memory_type: c_int, major: i32) -> bool {
    if major >= 6 {
        // Unregistered = 0, Host = 1, Device = 2, Managed = 3, Array = 10, Unified = 11.
        matches!(memory_type, 0 | 1)
    } else {
        // Host = 0, Device = 1, Array = 2, Unified = 3.
        memory_type == 0
    }
}

impl DeviceOps for Hip {
    /// The number of devices.
    ///
    /// # Errors
    ///
    /// `NoDevice` when the runtime reports none; the runtime's error.
    fn device_count() -> Result<usize> {
        result::init()
    }

    /// Makes `dev` current, always calling `hipSetDevice`: an explicit device switch also repairs
    /// the cache after code outside gpumem changed the thread's device.
    ///
    /// # Errors
    ///
    /// As `make_current`.
    fn set_device(dev: DeviceId) -> Result<()> {
        result::init()?;
        set_current(dev)
    }

    /// The device's properties, read attribute by attribute as the CUDA backend does. (HIP's
    /// `hipGetDeviceProperties` would fill a `hipDeviceProp_t`, whose layout in hip-sys is HIP 5.4's
    /// and which ROCm 6 changed.) Device queries take the ordinal, so no device is made current.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        use hipDeviceAttribute_t::*;
        result::init()?;
        let mut name: [c_char; 256] = [0; 256];
        // SAFETY: the buffer holds `len` bytes, which the runtime fills with a NUL-terminated name
        // (truncated to fit).
        check("hipDeviceGetName", unsafe {
            sys::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        // `c_char` is `i8` or `u8` by platform; the bytes are the same.
        let name: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        let mut total_memory: usize = 0;
        // SAFETY: `total_memory` is a valid out-pointer.
        check("hipDeviceTotalMem", unsafe { sys::hipDeviceTotalMem(&mut total_memory, dev) })?;
        Ok(DeviceProperties {
            name: String::from_utf8_lossy(&name).into_owned(),
            total_memory,
            // On AMD devices: the GCN/RDNA architecture's major and minor (gfx90a gives 9, 0).
            compute_capability: (
                attribute(dev, hipDeviceAttributeComputeCapabilityMajor)?,
                attribute(dev, hipDeviceAttributeComputeCapabilityMinor)?,
            ),
            multiprocessor_count: attribute(dev, hipDeviceAttributeMultiprocessorCount)?,
            memory_pools_supported: memory_pools_supported(dev)?,
            // ROCm gives every 64-bit Linux process one address space for host and devices; a
            // runtime too old to report the attribute has it all the same.
            unified_addressing: optional_attribute(dev, hipDeviceAttributeUnifiedAddressing)?
                .is_none_or(|v| v != 0),
        })
    }

    /// Free and total memory of the device (`hipMemGetInfo`, on the current device).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        make_current(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers.
        check("hipMemGetInfo", unsafe { sys::hipMemGetInfo(&mut free, &mut total) })?;
        Ok(MemInfo { free, total })
    }

    /// Waits for all work on the device.
    ///
    /// # Errors
    ///
    /// The runtime's error, including one left by earlier asynchronous work.
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        make_current(dev)?;
        // SAFETY: no arguments.
        check("hipDeviceSynchronize", unsafe { sys::hipDeviceSynchronize() })
    }

    /// Whether `dev` can access `peer`'s memory directly.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        result::init()?;
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer; the ordinals are integers the runtime checks.
        check("hipDeviceCanAccessPeer", unsafe { sys::hipDeviceCanAccessPeer(&mut can, dev, peer) })?;
        Ok(can != 0)
    }

    /// Lets `dev` access `peer`'s memory: `hipDeviceEnablePeerAccess(peer)` with `dev` current.
    /// Access already enabled is success (CuPy ignores that error too).
    ///
    /// # Errors
    ///
    /// The runtime's error (peers that cannot reach each other, a device and itself).
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        make_current(dev)?;
        // SAFETY: `peer` is an integer the runtime checks; the flags must be 0.
        match unsafe { sys::hipDeviceEnablePeerAccess(peer, 0) } {
            SUCCESS => Ok(()),
            ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                // Differs from the CUDA backend: the HIP runtime, like CUDA's runtime API (not its
                // driver API), also keeps the code as the thread's last error. Clear it, as CuPy
                // does, so a library reading `hipGetLastError` next does not see a failure that was
                // none.
                // SAFETY: no arguments; it only reads and resets the thread's last error.
                let _ = unsafe { sys::hipGetLastError() };
                Ok(())
            }
            code => Err(result::error("hipDeviceEnablePeerAccess", code)),
        }
    }

    /// The device of a pointer: `Some` for device (and managed) memory, `None` for host memory,
    /// pinned or not, and for addresses the runtime does not know.
    ///
    /// HIP 5 answers `hipErrorInvalidValue` for host memory it did not allocate or register, as the
    /// CUDA driver does for memory it does not know; that is `None` too.
    ///
    /// # Errors
    ///
    /// `NoDevice`; the runtime's error other than "not a HIP pointer".
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        result::init()?;
        let mut attributes = sys::PointerAttributes {
            memory_type: 0,
            device: -1,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: `attributes` is a valid out-pointer to a `#[repr(C)]` copy of
        // `hipPointerAttribute_t`; the runtime looks `ptr` up and reads nothing at it.
        match unsafe { sys::hipPointerGetAttributes(&mut attributes, ptr as *const c_void) } {
            SUCCESS => {}
            ERROR_INVALID_VALUE => return Ok(None),
            code => return Err(result::error("hipPointerGetAttributes", code)),
        }
        let host = is_host_memory(attributes.memory_type, runtime_major()) && attributes.is_managed == 0;
        Ok((!host && attributes.device >= 0).then_some(attributes.device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_types_are_read_with_the_runtime_numbering() {
        assert!(is_host_memory(0, 5));
        assert!(!is_host_memory(1, 5) && !is_host_memory(3, 5));
        assert!(is_host_memory(0, 6) && is_host_memory(1, 6));
        assert!(!is_host_memory(2, 6) && !is_host_memory(3, 6) && !is_host_memory(11, 6));
    }
}
