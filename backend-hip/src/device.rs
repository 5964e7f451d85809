//! Devices: the count, the current device of each thread, properties, memory information,
//! synchronisation, peer access, and which device a pointer belongs to.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use gpumem_core::{DeviceId, DeviceProperties, DevicePtr, MemInfo, Result};
use hip_sys::hiprt::hipDeviceAttribute_t;

use crate::result::{check, init, sys, ERROR_INVALID_VALUE, ERROR_PEER_ACCESS_ALREADY_ENABLED};

thread_local! {
    /// The device this thread last made current through [`set_device`]. HIP's current device is
    /// per thread, as this cache is; a program that calls `hipSetDevice` itself, behind gpumem's
    /// back, must not rely on gpumem restoring its choice.
    static CURRENT: Cell<Option<DeviceId>> = const { Cell::new(None) };
}

/// Number of devices (see [`init`]).
pub(crate) fn device_count() -> Result<usize> {
    init()
}

/// Makes `dev` HIP's current device for the calling thread. The CUDA backend makes the
/// device's primary context current; HIP has one implicit context per device, selected by
/// `hipSetDevice`. Cached per thread, so the common case makes no runtime call.
pub(crate) fn set_device(dev: DeviceId) -> Result<()> {
    // `try_with`: during thread teardown the cache may be gone; then the call is simply made.
    if CURRENT.try_with(Cell::get) == Ok(Some(dev)) {
        return Ok(());
    }
    init()?;
    // SAFETY: takes an integer; the runtime checks it.
    check("hipSetDevice", unsafe { sys::hipSetDevice(dev) })?;
    let _ = CURRENT.try_with(|c| c.set(Some(dev)));
    Ok(())
}

fn attribute(dev: DeviceId, attr: hipDeviceAttribute_t) -> Result<i32> {
    let mut value: c_int = 0;
    // SAFETY: an out-pointer to a local; `attr` is a variant hip-sys lists, so a valid enum.
    check("hipDeviceGetAttribute", unsafe { sys::hipDeviceGetAttribute(&mut value, attr, dev) })?;
    Ok(value)
}

/// An attribute the runtime may not know: HIP answers `hipErrorInvalidValue` for an attribute
/// it was built without (HIP 5.x's runtimes add them release by release); `None` then.
fn optional_attribute(dev: DeviceId, attr: hipDeviceAttribute_t) -> Result<Option<i32>> {
    match attribute(dev, attr) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code() == Some(i64::from(ERROR_INVALID_VALUE)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The device's properties, read attribute by attribute rather than through
/// `hipGetDeviceProperties`: hip-sys's `hipDeviceProp_t` is HIP 5.4's layout, and ROCm 6 changed
/// the structure (and renamed the function behind a macro), while the attribute numbers below are
/// the same in HIP 5.2, 5.4 and ROCm 6.
pub(crate) fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
    use hipDeviceAttribute_t as A;
    set_device(dev)?;

    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer is 256 bytes long, as passed; the runtime NUL-terminates within it.
    check("hipDeviceGetName", unsafe { sys::hipDeviceGetName(name.as_mut_ptr(), 256, dev) })?;
    let name: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();

    let mut total_memory = 0usize;
    // SAFETY: an out-pointer to a local.
    check("hipDeviceTotalMem", unsafe { sys::hipDeviceTotalMem(&mut total_memory, dev) })?;

    Ok(DeviceProperties {
        name: String::from_utf8_lossy(&name).into_owned(),
        total_memory,
        // On AMD devices these are the GCN/RDNA architecture's major and minor (gfx90a: 9, 0).
        compute_capability: (
            attribute(dev, A::hipDeviceAttributeComputeCapabilityMajor)?,
            attribute(dev, A::hipDeviceAttributeComputeCapabilityMinor)?,
        ),
        multiprocessor_count: attribute(dev, A::hipDeviceAttributeMultiprocessorCount)?,
        memory_pools_supported: memory_pools_supported(dev)?,
        // ROCm gives every 64-bit Linux process one address space for host and devices; a
        // runtime too old to report the attribute still has it.
        unified_addressing: optional_attribute(dev, A::hipDeviceAttributeUnifiedAddressing)?
            .is_none_or(|v| v != 0),
    })
}

/// Whether `dev` has a stream-ordered allocator (`hipDeviceAttributeMemoryPoolsSupported`). A
/// runtime that does not know the attribute has none to offer.
pub(crate) fn memory_pools_supported(dev: DeviceId) -> Result<bool> {
    Ok(optional_attribute(dev, hipDeviceAttribute_t::hipDeviceAttributeMemoryPoolsSupported)?
        .is_some_and(|v| v != 0))
}

/// Free and total memory of `dev`.
pub(crate) fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
    set_device(dev)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to locals.
    check("hipMemGetInfo", unsafe { sys::hipMemGetInfo(&mut free, &mut total) })?;
    Ok(MemInfo { free, total })
}

/// Waits for all work on `dev`.
pub(crate) fn device_synchronize(dev: DeviceId) -> Result<()> {
    set_device(dev)?;
    // SAFETY: no arguments.
    check("hipDeviceSynchronize", unsafe { sys::hipDeviceSynchronize() })
}

/// Whether `dev` can access `peer`'s memory directly.
pub(crate) fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
    set_device(dev)?;
    let mut can: c_int = 0;
    // SAFETY: an out-pointer to a local; the devices are integers the runtime checks.
    check("hipDeviceCanAccessPeer", unsafe { sys::hipDeviceCanAccessPeer(&mut can, dev, peer) })?;
    Ok(can != 0)
}

/// Enables `dev`'s access to `peer`'s memory; already enabled counts as success.
pub(crate) fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
    set_device(dev)?;
    // SAFETY: integers the runtime checks; flags must be 0.
    match unsafe { sys::hipDeviceEnablePeerAccess(peer, 0) } {
        ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            // HIP keeps the code as the thread's last error; clear it, as CuPy does, so another
            // library reading `hipGetLastError` does not see a failure that was none.
            // SAFETY: no arguments; only resets the thread's last error.
            let _ = unsafe { sys::hipGetLastError() };
            Ok(())
        }
        code => check("hipDeviceEnablePeerAccess", code),
    }
}

/// The runtime's major version, read once (`HIP_VERSION` is major * 10^7 + minor * 10^5 +
/// patch). If it cannot be read, the HIP 5 numbering this crate was written against is assumed.
fn runtime_major() -> i32 {
    static MAJOR: OnceLock<i32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        let mut version: c_int = 0;
        // SAFETY: an out-pointer to a local.
        match unsafe { sys::hipRuntimeGetVersion(&mut version) } {
            crate::result::SUCCESS if version > 0 => version / 10_000_000,
            _ => 5,
        }
    })
}

/// Whether a pointer's memory type, as this runtime numbers `hipMemoryType`, is host memory
/// gpumem must not tie to a device.
fn is_host_memory(memory_type: c_int, major: i32) -> bool {
    if major >= 6 {
        // ROCm 6: Unregistered = 0, Host = 1, Device = 2, Managed = 3, Array = 10, Unified = 11.
        matches!(memory_type, 0 | 1)
    } else {
        // HIP 5: Host = 0, Device = 1, Array = 2, Unified = 3.
        memory_type == 0
    }
}

/// The device `ptr` belongs to: `Some` for device (and managed) memory, `None` for host memory
/// and memory HIP does not know.
///
/// HIP 5.x answers `hipErrorInvalidValue` for a host pointer it did not allocate or register
/// (CUDA before 11 did the same; CUDA 11+ reports it as unregistered), so that code is `None`
/// here, not an error.
pub(crate) fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
    init()?;
    let mut attributes = sys::PointerAttributes {
        memory_type: 0,
        device: -1,
        device_pointer: std::ptr::null_mut(),
        host_pointer: std::ptr::null_mut(),
        is_managed: 0,
        allocation_flags: 0,
    };
    // SAFETY: the runtime writes only into `attributes` (a `#[repr(C)]` copy of
    // `hipPointerAttribute_t`) and reads nothing at `ptr`: it looks the address up.
    match unsafe { sys::hipPointerGetAttributes(&mut attributes, ptr as *const c_void) } {
        ERROR_INVALID_VALUE => return Ok(None),
        code => check("hipPointerGetAttributes", code)?,
    }
    let host = is_host_memory(attributes.memory_type, runtime_major()) && attributes.is_managed == 0;
    Ok((!host && attributes.device >= 0).then_some(attributes.device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_types_are_read_with_the_runtime_numbering() {
        assert!(is_host_memory(0, 5));
        assert!(!is_host_memory(1, 5));
        assert!(is_host_memory(0, 6) && is_host_memory(1, 6));
        assert!(!is_host_memory(2, 6) && !is_host_memory(3, 6));
    }
}
