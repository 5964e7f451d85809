//! The typed layer (layer 3): the only code generic over a backend. It validates every argument
//! before a backend sees it, keeps the memory that queued work can reach alive, and makes pointers
//! of the pool's chunks.
//!
//! - [`state`]: the lowest per-backend state: the current device, deferred errors; each layer
//!   above keeps its own ([`statics`]: [`Runtime`], every layer's state together).
//! - [`device`]: devices and the current device.
//! - [`memory`] and [`pointer`](mod@pointer): memory objects and [`MemoryPointer`]; [`transfer`]: their
//!   copies and memsets; [`staging`]: synchronous copies of pageable memory through pinned
//!   buffers; [`pinned`]: pinned host memory; [`buffer`]: typed buffers over pointers.
//! - [`pools`]: [`SingleDeviceMemoryPool`] and [`MemoryPool`], the pool of [`crate::pool`] with
//!   pointers, streams and the runtime's allocator; [`allocator`]: CuPy's current allocator.
//! - [`stream`]: streams, events, graphs and callbacks, the one tight cluster.

pub mod allocator;
pub mod buffer;
pub mod device;
#[allow(unsafe_code)] // the raw blocks' memory objects
pub mod device_allocator;
#[allow(unsafe_code)]
pub mod memory;
#[allow(unsafe_code)]
pub mod pinned;
#[allow(unsafe_code)]
pub mod pointer;
#[allow(unsafe_code)] // the stream-ordered allocator's memory objects and frees
pub mod pools;
#[allow(unsafe_code)]
pub mod staging;
pub mod state;
pub mod statics;
#[allow(unsafe_code)]
pub mod stream;
#[allow(unsafe_code)]
pub mod transfer;

pub use buffer::DeviceBuffer;
pub use pointer::MemoryPointer;
pub use pools::{MemoryPool, SingleDeviceMemoryPool};
pub use statics::Runtime;
