//! The backend contract (layer 1): what a GPU runtime must provide for gpumem to run on it.
//!
//! A backend is a zero-sized marker type implementing [`Api`] (its name, its capabilities and its
//! raw handle types) and one trait per concern: [`DeviceOps`], [`MemoryOps`], [`StreamOps`],
//! [`EventOps`] and [`GraphOps`]. Each backend implements each trait in the file of that concern
//! (`device.rs`, `memory.rs`, ...), so there is no table forwarding the contract to modules.
//! [`Backend`] names all seven together. Its associated functions are the runtime's raw operations,
//! one per driver call (or per small group of calls). Everything is static dispatch: the typed layer
//! (`Stream<B>`, `MemoryPointer<B>`) is generic over `B: Runtime` (a `Backend` with the typed
//! layer's per-backend state) and is monomorphised
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
//! # What a backend can do
//!
//! [`Api::CAPS`] says it, as constants: capture, a stream-ordered allocator, host functions, the
//! virtual-memory API, peer access. The typed layer reads them instead of calling an operation to
//! see whether it fails: a backend without capture is never asked for a capture status on every
//! synchronous copy. An operation outside a backend's capabilities still returns
//! [`Error::Unsupported`](crate::Error::Unsupported) when called, and touches nothing.
//!
//! This module imports nothing of gpumem but [`crate::error`]; `core/tests/layers.rs` keeps it so.
//!
//! # Safety
//!
//! Raw stream handles are plain `Copy` data, so every function that takes one is `unsafe`: a
//! handle kept past its stream's destruction must never reach a backend from safe code (a backend
//! cannot tell a dead handle from a live one, and the host backend's handles are addresses).
//! Functions that take raw device or host addresses are `unsafe`: the caller guarantees that the
//! address range is valid for the access (allocated, not freed, of the right kind) until the
//! operation completes; for asynchronous operations that is until the stream reaches it. Raw
//! handles (streams, events, graphs) passed to a backend must have been created by the same
//! backend (or, for streams, wrapped from a live foreign handle) and not yet destroyed.

mod device;
mod event;
mod graph;
mod memory;
mod stream;
pub mod types;
mod vmm;

use std::fmt::Debug;
use std::hash::Hash;

pub use device::DeviceOps;
pub use event::EventOps;
pub use graph::GraphOps;
pub use memory::MemoryOps;
pub use stream::StreamOps;
pub use types::{
    AsyncPoolAttribute, Caps, CaptureMode, CaptureStatus, DeviceId, DeviceProperties, DevicePtr, EventFlags,
    HostFn, MemInfo, StreamCallback, StreamFlags,
};
pub use vmm::{PhysicalHandle, VirtualMemoryOps};

/// A backend's identity: its name, what it can do, and its raw handle types.
pub trait Api: Sized + Send + Sync + Debug + 'static {
    /// The backend's name in errors and reports: `"host"`, `"cuda"`, `"hip"`.
    const NAME: &'static str;
    /// What the backend can do. See [`Caps`].
    const CAPS: Caps;

    /// A raw stream handle. Plain data: copying it does not duplicate the stream.
    type Stream: Copy + Eq + Hash + Send + Sync + Debug + 'static;
    /// A raw event handle, owned by the typed `Event` and destroyed by [`EventOps::event_destroy`].
    type Event: Send + Sync + Debug + 'static;
    /// An instantiated graph (the graph and its executable form), owned by the typed `Graph` and
    /// destroyed by [`GraphOps::graph_destroy`].
    type Graph: Send + Sync + Debug + 'static;
}

/// A whole backend: [`Api`] and every operation trait. Implemented for every type that
/// implements them all; see the [module docs](self) for the contract.
pub trait Backend: Api + DeviceOps + MemoryOps + StreamOps + EventOps + GraphOps + VirtualMemoryOps {}

impl<T: Api + DeviceOps + MemoryOps + StreamOps + EventOps + GraphOps + VirtualMemoryOps> Backend for T {}
