//! Devices and their primary contexts: enumeration, the calling thread's current context,
//! properties, memory information, synchronisation, peer access and pointer queries.
//!
//! Each device's primary context is retained once, on first use, and kept for the rest of the
//! process: gpumem's memory, streams and events may live as long as the process, and the primary
//! context is the one the CUDA runtime (and so CuPy, PyTorch and every runtime-API library) uses,
//! so handles pass freely between gpumem and them.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::sys::{self, CUcontext, CUctx_st, CUdevice, CUresult};
use gpumem_core::{DeviceId, DeviceOps, DeviceProperties, DevicePtr, Error, MemInfo, Result};

use crate::Cuda;

use crate::result::{
    self, check, code, BACKEND, ERROR_INVALID_VALUE, ERROR_PEER_ACCESS_ALREADY_ENABLED, SUCCESS,
};

/// One device: its driver handle, its primary context once retained, and per-device state of
/// the stream-ordered allocator.
pub(crate) struct DeviceSlot {
    /// The driver's handle for the device (`cuDeviceGet`).
    pub(crate) handle: CUdevice,
    /// The retained primary context; null until first use, then fixed for the process.
    context: AtomicPtr<CUctx_st>,
    /// Whether the device supports `cuMemAllocAsync`, known once its default pool is prepared
    /// (see `memory::prepare_async_pool`).
    pub(crate) async_pool: OnceLock<bool>,
}

/// All devices, enumerated once after `cuInit`.
struct Devices {
    slots: Box<[DeviceSlot]>,
    /// Serialises retaining primary contexts, so each is retained once.
    retain: Mutex<()>,
}

thread_local! {
    /// The context gpumem last made current on this thread. `cuCtxSetCurrent` is called only
    /// when an operation needs another one.
    static CURRENT: Cell<CUcontext> = const { Cell::new(ptr::null_mut()) };
}

/// The device table, enumerated on first use.
fn devices() -> Result<&'static Devices> {
    static DEVICES: OnceLock<std::result::Result<Devices, (&'static str, CUresult)>> = OnceLock::new();
    result::init()?;
    match DEVICES.get_or_init(enumerate) {
        Ok(devices) => Ok(devices),
        Err((api, failure)) => Err(result::error(api, *failure)),
    }
}

/// Counts the devices and gets each one's handle; a failure is kept with the entry point that
/// failed.
fn enumerate() -> std::result::Result<Devices, (&'static str, CUresult)> {
    let mut count: c_int = 0;
    // SAFETY: `init` succeeded (checked by the caller); `count` is a valid out-pointer.
    let r = unsafe { sys::cuDeviceGetCount(&mut count) };
    if code(r) != SUCCESS {
        return Err(("cuDeviceGetCount", r));
    }
    let mut slots = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    for ordinal in 0..count {
        let mut handle: CUdevice = 0;
        // SAFETY: `ordinal` is below the count the driver just gave; `handle` is a valid
        // out-pointer.
        let r = unsafe { sys::cuDeviceGet(&mut handle, ordinal) };
        if code(r) != SUCCESS {
            return Err(("cuDeviceGet", r));
        }
        slots.push(DeviceSlot {
            handle,
            context: AtomicPtr::new(ptr::null_mut()),
            async_pool: OnceLock::new(),
        });
    }
    Ok(Devices { slots: slots.into_boxed_slice(), retain: Mutex::new(()) })
}

/// The slot of device `dev`.
///
/// # Errors
///
/// `NoDevice` when there are none; the driver's own error for an ordinal it does not know.
pub(crate) fn slot(dev: DeviceId) -> Result<&'static DeviceSlot> {
    let devices = devices()?;
    if devices.slots.is_empty() {
        return Err(Error::NoDevice { backend: BACKEND });
    }
    match usize::try_from(dev).ok().and_then(|i| devices.slots.get(i)) {
        Some(slot) => Ok(slot),
        None => Err(invalid_device(dev)),
    }
}

/// The driver's answer for an ordinal outside the table (`CUDA_ERROR_INVALID_DEVICE`).
#[cold]
fn invalid_device(dev: DeviceId) -> Error {
    let mut handle: CUdevice = 0;
    // SAFETY: the driver is initialised (the table exists); `handle` is a valid out-pointer.
    let r = unsafe { sys::cuDeviceGet(&mut handle, dev) };
    if code(r) != SUCCESS {
        return result::error("cuDeviceGet", r);
    }
    // The driver knows an ordinal it did not count at start: report it as it would.
    Error::backend(BACKEND, "cuDeviceGet", 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal")
}

/// The device's primary context, retained on first use.
fn context(slot: &DeviceSlot) -> Result<CUcontext> {
    let ctx = slot.context.load(Ordering::Acquire);
    if !ctx.is_null() {
        return Ok(ctx);
    }
    retain(slot)
}

/// Retains the device's primary context, once per process (the slow path of [`context`]).
#[cold]
fn retain(slot: &DeviceSlot) -> Result<CUcontext> {
    let devices = devices()?;
    // A panic cannot happen while the lock is held (only a driver call runs under it), but a
    // poisoned lock would still guard nothing but `()`: take it regardless.
    let _guard = devices.retain.lock().unwrap_or_else(PoisonError::into_inner);
    let ctx = slot.context.load(Ordering::Acquire);
    if !ctx.is_null() {
        return Ok(ctx);
    }
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: the driver is initialised and `slot.handle` came from `cuDeviceGet`; `ctx` is a
    // valid out-pointer. The retain is never released: the context lives as long as the process.
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, slot.handle) })?;
    slot.context.store(ctx, Ordering::Release);
    Ok(ctx)
}

/// Makes `ctx` the calling thread's current context and remembers it.
fn set_current(ctx: CUcontext) -> Result<()> {
    // SAFETY: `ctx` is a primary context this process retained and never releases.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    // At thread exit the cache may be gone; the next call then sets the context again.
    let _ = CURRENT.try_with(|c| c.set(ctx));
    Ok(())
}

/// Makes device `dev`'s primary context current on the calling thread, unless this thread's
/// cache says it already is, and returns the device's slot. Every operation that runs in a
/// device calls this first; it also starts the driver.
///
/// # Errors
///
/// `DriverNotFound`, `NoDevice`; the driver's error for an unknown device or a failed retain.
pub(crate) fn make_current(dev: DeviceId) -> Result<&'static DeviceSlot> {
    let slot = slot(dev)?;
    let ctx = context(slot)?;
    if !matches!(CURRENT.try_with(|c| c.get() == ctx), Ok(true)) {
        set_current(ctx)?;
    }
    Ok(slot)
}

/// One integer attribute of a device.
///
/// # Errors
///
/// The driver's error.
pub(crate) fn attribute(slot: &DeviceSlot, attribute: c_int) -> Result<i32> {
    let mut value: c_int = 0;
    // SAFETY: the driver is initialised (a slot exists only then); `value` is a valid
    // out-pointer; `attribute` is one of `CUdevice_attribute`'s values.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, slot.handle) })?;
    Ok(value)
}

/// `CU_MEMORYTYPE_HOST`, as the integer `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` writes.
const MEMORYTYPE_HOST: c_uint = 1;

/// Makes sure the calling thread has a current context (device 0's primary context when it has
/// none), for queries that take no device.
fn ensure_context() -> Result<()> {
    if matches!(CURRENT.try_with(|c| !c.get().is_null()), Ok(true)) {
        return Ok(());
    }
    devices()?;
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: the driver is initialised (`devices` succeeded); `ctx` is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        make_current(0)?;
    }
    Ok(())
}

impl DeviceOps for Cuda {
    /// The number of devices.
    ///
    /// # Errors
    ///
    /// `DriverNotFound`; `NoDevice` when the driver reports none; the driver's error.
    fn device_count() -> Result<usize> {
        match devices()?.slots.len() {
            0 => Err(Error::NoDevice { backend: BACKEND }),
            n => Ok(n),
        }
    }

    /// Makes `dev`'s primary context current, always calling `cuCtxSetCurrent`: an explicit device
    /// switch also repairs the cache after code outside gpumem changed the thread's context.
    ///
    /// # Errors
    ///
    /// As `make_current`.
    fn set_device(dev: DeviceId) -> Result<()> {
        let ctx = context(slot(dev)?)?;
        set_current(ctx)
    }

    /// The device's properties. Device queries need no context, so none is created for them.
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        use sys::{
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        };
        let slot = slot(dev)?;
        let mut name: [c_char; 256] = [0; 256];
        // SAFETY: the buffer holds `len` bytes, which the driver fills with a NUL-terminated name
        // (truncated to fit).
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, slot.handle)
        })?;
        // `c_char` is `i8` or `u8` by platform; the bytes are the same.
        let name: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        let mut total_memory: usize = 0;
        // SAFETY: `total_memory` is a valid out-pointer; the handle is the driver's.
        check("cuDeviceTotalMem_v2", unsafe { sys::cuDeviceTotalMem_v2(&mut total_memory, slot.handle) })?;
        Ok(DeviceProperties {
            name: String::from_utf8_lossy(&name).into_owned(),
            total_memory,
            compute_capability: (
                attribute(slot, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(slot, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessor_count: attribute(slot, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            memory_pools_supported: attribute(slot, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
            unified_addressing: attribute(slot, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
        })
    }

    /// Free and total memory of the device (`cuMemGetInfo`, in the device's context).
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        make_current(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the device's context is current; both are valid out-pointers.
        check("cuMemGetInfo_v2", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok(MemInfo { free, total })
    }

    /// Waits for all work in the device's context.
    ///
    /// # Errors
    ///
    /// The driver's error, including a sticky error of earlier work.
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        make_current(dev)?;
        // SAFETY: the device's context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Whether `dev` can access `peer`'s memory directly (false for a device and itself, as CUDA
    /// answers).
    ///
    /// # Errors
    ///
    /// The driver's error.
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        let (dev, peer) = (slot(dev)?, slot(peer)?);
        let mut can: c_int = 0;
        // SAFETY: both handles are the driver's; `can` is a valid out-pointer.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, dev.handle, peer.handle)
        })?;
        Ok(can != 0)
    }

    /// Lets `dev`'s context access `peer`'s memory: `cuCtxEnablePeerAccess` from `dev`'s primary
    /// context to `peer`'s. Access already enabled is success (CuPy ignores that error too).
    ///
    /// # Errors
    ///
    /// The driver's error (peers that cannot reach each other, a device and itself).
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        let peer_ctx = context(slot(peer)?)?;
        make_current(dev)?;
        // SAFETY: `dev`'s context is current and `peer_ctx` is a retained primary context; the
        // flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        match code(r) {
            SUCCESS | ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            _ => Err(result::error("cuCtxEnablePeerAccess", r)),
        }
    }

    /// The device of a pointer: `Some` for device (and managed) memory, `None` for host memory,
    /// pinned or not, and for addresses the driver does not know.
    ///
    /// # Errors
    ///
    /// `DriverNotFound`, `NoDevice`; the driver's error other than "not a CUDA pointer".
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        ensure_context()?;
        let address = ptr as sys::CUdeviceptr;
        let mut memory_type: c_uint = 0;
        // SAFETY: a context is current; the attribute is written as an `unsigned int` (the C enum
        // `CUmemorytype`), which `memory_type` is, and read back as that integer.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut memory_type as *mut c_uint).cast::<c_void>(),
                sys::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                address,
            )
        };
        match code(r) {
            SUCCESS if memory_type == MEMORYTYPE_HOST => return Ok(None),
            SUCCESS => {}
            // An address the driver does not know (pageable host memory, say).
            ERROR_INVALID_VALUE => return Ok(None),
            _ => return Err(result::error("cuPointerGetAttribute", r)),
        }
        let mut ordinal: c_int = -1;
        // SAFETY: as above; the device ordinal is written as an `int`.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut c_int).cast::<c_void>(),
                sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                address,
            )
        };
        match code(r) {
            SUCCESS if ordinal >= 0 => Ok(Some(ordinal)),
            SUCCESS | ERROR_INVALID_VALUE => Ok(None),
            _ => Err(result::error("cuPointerGetAttribute", r)),
        }
    }
}
