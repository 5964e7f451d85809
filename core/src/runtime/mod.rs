//! The typed layer (layer 3): the only code generic over a backend. It validates every argument
//! before a backend sees it, keeps the memory that queued work can reach alive, and makes pointers
//! of the pool's chunks.
//!
//! Its modules, lowest first; each imports only those before it (`tests/layers.rs` checks it):
//!
//! - [`state`]: the lowest per-backend state (the current device, the errors and drops `Drop`
//!   leaves for later), reached through [`StateRuntime`](state::StateRuntime).
//! - [`memory`]: memory objects.
//! - [`stream`]: streams, events, graphs and callbacks, and what queued work keeps alive; its
//!   state through [`StreamRuntime`](stream::StreamRuntime).
//! - [`device`]: [`Device`](device::Device), and setting the current device.
//! - [`device_allocator`]: the runtime's raw allocator for the pools (fixed or growing blocks).
//! - [`pointer`](mod@pointer): [`MemoryPointer`] and the [`Allocator`](pointer::Allocator) trait;
//!   [`pinned`]: pinned host memory.
//! - [`pools`]: [`SingleDeviceMemoryPool`] and [`MemoryPool`], the pool of [`crate::pool`] with
//!   pointers, streams and the runtime's allocator.
//! - [`allocator`]: CuPy's current allocators and the default pools; their state through
//!   [`AllocatorRuntime`](allocator::AllocatorRuntime).
//! - [`statics`]: [`Runtime`], every layer's state together, and the macro that declares it.
//! - [`buffer`]: typed buffers over pointers; [`staging`]: synchronous copies of pageable memory
//!   through pinned buffers; [`transfer`]: the copies and memsets of pointers.

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
