//! Plain data the contract passes around: device ids, addresses, flags, capture states, device
//! facts and what a backend can do.

use std::ffi::c_void;

use crate::error::Result;

/// A device ordinal, as the runtime numbers devices (`0..device_count()`).
pub type DeviceId = i32;

/// A raw device address. Plain data: the typed layer owns the memory it names.
pub type DevicePtr = usize;

/// A host function launched into a stream (`cuLaunchHostFunc` / `hipLaunchHostFunc` form).
///
/// It must not unwind: the typed layer passes only trampolines that catch panics.
pub type HostFn = unsafe extern "C" fn(data: *mut c_void);

/// A one-shot stream callback, given the stream's status when it ran (`Ok` or the stream's
/// sticky error). It must not unwind; the typed layer's callbacks catch panics.
pub type StreamCallback = Box<dyn FnOnce(Result<()>) + Send + 'static>;

/// What a backend can do, as constants the typed layer and the tests read (instead of trying an
/// operation and treating [`Error::Unsupported`](crate::Error::Unsupported) as an answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caps {
    /// Stream capture into graphs, and graph launches.
    pub capture: bool,
    /// A stream-ordered allocator (`cuMemAllocAsync` / `hipMallocAsync`).
    pub stream_ordered_allocation: bool,
    /// Host functions queued on streams (`cuLaunchHostFunc`); callbacks are always available.
    pub host_functions: bool,
    /// The virtual-memory API (reserve an address range, map physical memory into it).
    pub virtual_memory: bool,
    /// Peer access between devices.
    pub peer_access: bool,
}

/// An attribute of a device's stream-ordered pool (`CUmemPool_attribute` / `hipMemPoolAttr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncPoolAttribute {
    /// Free bytes the pool keeps cached when the runtime synchronises.
    ReleaseThreshold,
    /// Bytes the pool holds from the device, lent out or not (CuPy's `total_bytes`).
    ReservedCurrent,
    /// Bytes lent out (CuPy's `used_bytes`).
    UsedCurrent,
}

/// Stream creation flags (CuPy's `streamDefault = 0`, `streamNonBlocking = 1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamFlags {
    /// The stream does not synchronise with the legacy default stream.
    pub non_blocking: bool,
}

/// Event creation flags (CuPy's `eventBlockingSync = 1`, `eventDisableTiming = 2`,
/// `eventInterprocess = 4`). The typed layer checks the combinations before a backend sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventFlags {
    /// `synchronize` blocks the thread instead of spinning.
    pub blocking: bool,
    /// The event records no timestamp; `elapsed_time` with it is an error.
    pub disable_timing: bool,
    /// The event can be shared with other processes (requires `disable_timing`).
    pub interprocess: bool,
}

impl EventFlags {
    /// The runtime's bit set: blocking 1, disable timing 2, interprocess 4.
    #[must_use]
    pub fn bits(self) -> u32 {
        u32::from(self.blocking) | (u32::from(self.disable_timing) << 1) | (u32::from(self.interprocess) << 2)
    }
}

/// Stream capture mode (CuPy's `Global = 0`, `ThreadLocal = 1`, `Relaxed = 2`).
///
/// gpumem's default is [`CaptureMode::Relaxed`], as CuPy's: the pool may need to allocate raw
/// memory while a stream is capturing, which the other two modes forbid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Unsafe calls are refused in every thread while any global-mode capture is active.
    Global,
    /// Unsafe calls are refused in the capturing thread.
    ThreadLocal,
    /// No calls are refused because of the capture.
    #[default]
    Relaxed,
}

/// Where a stream stands with capture (CuPy's `None = 0`, `Active = 1`, `Invalidated = 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// The stream is not capturing.
    None,
    /// The stream is capturing.
    Active,
    /// The stream was capturing, but an error invalidated the capture sequence.
    Invalidated,
}

/// Device memory as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes free on the device.
    pub free: usize,
    /// Bytes the device has in all.
    pub total: usize,
}

/// What gpumem needs to know of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The device's name, as the runtime gives it.
    pub name: String,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Compute capability (CUDA) or GCN/RDNA architecture major/minor (HIP); `(0, 0)` on the host.
    pub compute_capability: (i32, i32),
    /// Number of multiprocessors (compute units).
    pub multiprocessor_count: i32,
    /// Whether the runtime supports a stream-ordered allocator on this device.
    pub memory_pools_supported: bool,
    /// Whether host and device share one address space (direction of copies inferred).
    pub unified_addressing: bool,
}
