//! The backend contract: what a GPU runtime must provide for gpumem to run on it.
//!
//! A backend is a zero-sized marker type implementing [`Backend`]. Its associated types are the
//! runtime's raw handles and its associated functions are the runtime's raw operations, one per
//! driver call (or per small group of calls). Everything is static dispatch: the typed layer
//! (`Stream<B>`, `MemoryPointer<B>`, the pool) is generic over `B: Backend` and is monomorphised
//! per backend, so a hot path never goes through a vtable.
//!
//! # Who validates
//!
//! A backend **only translates**. It never checks user input (bounds, device match, capture
//! state, flag combinations), never pools, and never keeps user-visible state. The typed layer
//! validates every argument once, before it calls the backend, so every backend sees only calls
//! that are valid as far as gpumem can know. What gpumem cannot know (a foreign stream handle that
//! was destroyed behind its back, a device lost mid-run) reaches the runtime, and the runtime's
//! answer comes back as [`Error::Backend`](crate::Error::Backend).
//!
//! # Devices and contexts
//!
//! Every operation that needs a device context takes the device id it runs on (`dev`). The
//! backend makes that device current for the calling thread as needed (the CUDA backend makes the
//! device's primary context current, cached per thread). The typed layer passes the pointer's or
//! the stream's device, or the thread's current device where CuPy uses it.
//!
//! # Errors
//!
//! Every fallible operation returns [`Result`]. Backends map their runtime's
//! codes as follows: a missing runtime library is [`Error::DriverNotFound`](crate::Error::DriverNotFound);
//! "no device" is [`Error::NoDevice`](crate::Error::NoDevice); a failed device allocation is
//! [`Error::OutOfMemory`](crate::Error::OutOfMemory) with `total: None` (so the pool's retry
//! ladder runs); an operation the runtime cannot do is [`Error::Unsupported`](crate::Error::Unsupported);
//! everything else is [`Error::Backend`](crate::Error::Backend) with the API name, the numeric
//! code and the runtime's own name and text for it. No backend function panics, including when
//! the runtime library is absent.
//!
//! # Safety
//!
//! Functions that take raw device or host addresses are `unsafe`: the caller guarantees that the
//! address range is valid for the access (allocated, not freed, of the right kind) until the
//! operation completes; for asynchronous operations that is until the stream reaches it. Raw
//! handles (streams, events, graphs) passed to a backend must have been created by the same
//! backend (or, for streams, wrapped from a live foreign handle) and not yet destroyed.

use std::ffi::c_void;
use std::fmt::Debug;
use std::hash::Hash;
use std::thread::LocalKey;

use crate::context::{Globals, ThreadState};
use crate::Result;

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

/// A GPU runtime, as gpumem's typed layer sees it. See the [module docs](self) for the contract.
pub trait Backend: Sized + Send + Sync + Debug + 'static {
    /// The backend's name in errors and reports: `"host"`, `"cuda"`, `"hip"`.
    const NAME: &'static str;

    /// A raw stream handle. Plain data: copying it does not duplicate the stream.
    type Stream: Copy + Eq + Hash + Send + Sync + Debug + 'static;
    /// A raw event handle, owned by the typed `Event` and destroyed by [`Backend::event_destroy`].
    type Event: Send + Sync + Debug + 'static;
    /// An instantiated graph (the graph and its executable form), owned by the typed `Graph` and
    /// destroyed by [`Backend::graph_destroy`].
    type Graph: Send + Sync + Debug + 'static;

    /// The thread-local state the typed layer keeps for this backend (current device, current
    /// streams, arena cache). Implemented by [`backend_statics!`](crate::backend_statics), which
    /// declares a `thread_local!` of the backend's own, so two backends never share state.
    fn thread_state() -> &'static LocalKey<ThreadState<Self>>;
    /// The process-wide state the typed layer keeps for this backend (default pools, allocator).
    /// Implemented by [`backend_statics!`](crate::backend_statics).
    fn globals() -> &'static Globals<Self>;

    // ---- stream handles -------------------------------------------------------------------

    /// The handle of the null stream (raw value 0).
    fn null_stream() -> Self::Stream;
    /// The handle of the legacy default stream (raw value 1 on CUDA). Synchronous copies and
    /// memsets run on it, as in CuPy.
    fn legacy_stream() -> Self::Stream;
    /// The handle of the calling thread's per-thread default stream (raw value 2).
    fn per_thread_stream() -> Self::Stream;
    /// The handle's raw value (CuPy's `Stream.ptr`).
    fn stream_to_raw(stream: Self::Stream) -> usize;
    /// A handle from its raw value.
    ///
    /// # Safety
    ///
    /// `raw` must be 0, 1, 2, or a live stream of this backend (created by it or by another
    /// library on the same runtime), and stay live while the handle is used.
    unsafe fn stream_from_raw(raw: usize) -> Self::Stream;

    // ---- devices --------------------------------------------------------------------------

    /// Number of devices.
    ///
    /// # Errors
    ///
    /// `DriverNotFound` when the runtime library cannot be loaded, `NoDevice` when it reports
    /// no device (a count of zero is returned as `NoDevice` too).
    fn device_count() -> Result<usize>;
    /// Makes `dev` the runtime's current device for the calling thread.
    ///
    /// # Errors
    ///
    /// The runtime's error for an invalid device.
    fn set_device(dev: DeviceId) -> Result<()>;
    /// The device's properties.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties>;
    /// Free and total memory of the device.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo>;
    /// Waits for all work on the device.
    ///
    /// # Errors
    ///
    /// The runtime's error, including a sticky error from earlier asynchronous work.
    fn device_synchronize(dev: DeviceId) -> Result<()>;
    /// Whether `dev` can access `peer`'s memory directly.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool>;
    /// Enables `dev`'s access to `peer`'s memory. Succeeds when it was already enabled.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()>;
    /// The device a pointer belongs to: `Some(dev)` for device memory, `None` for host memory
    /// (or memory the runtime does not know).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>>;

    // ---- memory ---------------------------------------------------------------------------

    /// Allocates `size > 0` bytes of device memory on `dev`, aligned to at least 256 bytes.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the device is out of memory; the runtime's error otherwise.
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr>;
    /// Frees memory from [`Backend::malloc`].
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc(dev, _)` and is freed once; no work that uses it is pending.
    ///
    /// # Errors
    ///
    /// The runtime's error (the memory is gone either way).
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()>;
    /// Allocates `size > 0` bytes of pinned (page-locked, portable) host memory.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the runtime cannot pin that much; the runtime's error otherwise.
    fn malloc_host(dev: DeviceId, size: usize) -> Result<*mut u8>;
    /// Frees memory from [`Backend::malloc_host`].
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc_host` and is freed once; no transfer that uses it is pending.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn free_host(dev: DeviceId, ptr: *mut u8) -> Result<()>;
    /// Allocates `size > 0` bytes from the device's stream-ordered allocator, ordered on
    /// `stream`. The backend raises the allocator's release threshold on first use, so freed
    /// memory stays cached in the runtime.
    ///
    /// # Errors
    ///
    /// `Unsupported` where the runtime or device has no stream-ordered allocator;
    /// `OutOfMemory`; the runtime's error.
    fn malloc_async(dev: DeviceId, size: usize, stream: Self::Stream) -> Result<DevicePtr>;
    /// Frees memory from [`Backend::malloc_async`], ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `ptr` came from `malloc_async` and is freed once; work that uses it is ordered before
    /// this call on `stream`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: Self::Stream) -> Result<()>;

    // ---- transfers ------------------------------------------------------------------------

    /// Copies `n` bytes, the direction inferred from the addresses (unified addressing), on the
    /// legacy default stream; returns when the copy is done as far as the host can observe.
    ///
    /// # Safety
    ///
    /// `src..src+n` is readable and `dst..dst+n` writable for the runtime; they do not overlap.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()>;
    /// Copies `n` bytes, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// As [`Backend::memcpy`], until the stream reaches the copy; host memory is pinned.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: Self::Stream,
    ) -> Result<()>;
    /// Sets `n` bytes at `dst` to `value` on the legacy default stream.
    ///
    /// # Safety
    ///
    /// `dst..dst+n` is writable device memory.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()>;
    /// Sets `n` bytes at `dst` to `value`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// As [`Backend::memset`], until the stream reaches it.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: Self::Stream,
    ) -> Result<()>;

    // ---- streams --------------------------------------------------------------------------

    /// The device's stream priority range as `(least, greatest)`; lower numbers are higher
    /// priorities on CUDA and HIP, so `least >= greatest`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)>;
    /// Creates a stream on `dev`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<Self::Stream>;
    /// Destroys a stream from [`Backend::stream_create`]. Work already queued still runs.
    ///
    /// # Safety
    ///
    /// The handle came from `stream_create` and is destroyed once.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn stream_destroy(dev: DeviceId, stream: Self::Stream) -> Result<()>;
    /// The flags the stream was created with.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_flags(dev: DeviceId, stream: Self::Stream) -> Result<StreamFlags>;
    /// The stream's priority.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_priority(dev: DeviceId, stream: Self::Stream) -> Result<i32>;
    /// `Ok(true)` when all work queued on the stream is done, `Ok(false)` while some is not.
    /// Querying a capturing stream invalidates the capture, as the runtimes do.
    ///
    /// # Errors
    ///
    /// The runtime's error for a failed query.
    fn stream_query(dev: DeviceId, stream: Self::Stream) -> Result<bool>;
    /// Waits for all work queued on the stream.
    ///
    /// # Errors
    ///
    /// The runtime's error (a capturing stream gives an error and invalidates the capture).
    fn stream_synchronize(dev: DeviceId, stream: Self::Stream) -> Result<()>;
    /// Makes future work on `stream` wait for the last `record` of `event`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn stream_wait_event(dev: DeviceId, stream: Self::Stream, event: &Self::Event) -> Result<()>;
    /// Queues `func(data)` on the stream, to run on a runtime thread once the work before it is
    /// done. Captured into a graph, it runs on every launch of the graph.
    ///
    /// # Safety
    ///
    /// `func` does not unwind; `data` stays valid for every call the runtime makes (once if not
    /// capturing; as long as the graph lives if capturing).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: Self::Stream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()>;
    /// Queues a one-shot callback that runs once the work before it is done, given the stream's
    /// status. Not capturable.
    ///
    /// # Errors
    ///
    /// The runtime's error (the callback is then dropped without running).
    fn add_callback(dev: DeviceId, stream: Self::Stream, callback: StreamCallback) -> Result<()>;

    // ---- capture and graphs -----------------------------------------------------------------

    /// Starts capturing the work queued on `stream` into a graph.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    fn begin_capture(dev: DeviceId, stream: Self::Stream, mode: CaptureMode) -> Result<()>;
    /// Ends the capture and instantiates the captured graph.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error (not capturing,
    /// invalidated, unjoined work).
    fn end_capture(dev: DeviceId, stream: Self::Stream) -> Result<Self::Graph>;
    /// The stream's capture status.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error (for instance an
    /// implicit-synchronisation conflict with a capturing blocking stream).
    fn capture_status(dev: DeviceId, stream: Self::Stream) -> Result<CaptureStatus>;
    /// Launches the graph on `stream`.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    fn graph_launch(dev: DeviceId, graph: &Self::Graph, stream: Self::Stream) -> Result<()>;
    /// Uploads the graph's resources to the device ahead of its first launch, ordered on
    /// `stream`.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    fn graph_upload(dev: DeviceId, graph: &Self::Graph, stream: Self::Stream) -> Result<()>;
    /// Destroys the graph. Launches already queued still run.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn graph_destroy(dev: DeviceId, graph: Self::Graph) -> Result<()>;

    // ---- events -----------------------------------------------------------------------------

    /// Creates an event on `dev`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<Self::Event>;
    /// Destroys an event.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_destroy(dev: DeviceId, event: Self::Event) -> Result<()>;
    /// Records the event at the current end of `stream`'s work.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_record(dev: DeviceId, event: &Self::Event, stream: Self::Stream) -> Result<()>;
    /// `Ok(true)` when the work before the last `record` is done (or the event was never
    /// recorded), `Ok(false)` while it is not.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_query(dev: DeviceId, event: &Self::Event) -> Result<bool>;
    /// Waits for the work before the last `record`.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn event_synchronize(dev: DeviceId, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two completed, timing-enabled events.
    ///
    /// # Errors
    ///
    /// The runtime's error (an event not yet complete, or with timing disabled).
    fn event_elapsed_ms(dev: DeviceId, start: &Self::Event, end: &Self::Event) -> Result<f32>;
}
