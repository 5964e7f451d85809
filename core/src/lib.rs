//! gpumem's core: the backend contract, the typed API over it, the caching memory pool, memory
//! hooks, and the host backend.
//!
//! Most programs use the `gpumem` facade crate, which picks a backend and exports this crate's
//! types under CuPy's names (`gpumem::MemoryPointer`, `gpumem::Stream`, ...). This crate is what
//! backends and the facade are built on.
//!
//! # How it is cut
//!
//! - [`backend`]: the contract. A backend ([`Backend`]) is a marker type whose associated
//!   functions are the runtime's raw operations. **Backends translate; the typed layer
//!   validates.** Bounds, device matching, capture state and flag combinations are checked once,
//!   here, before any backend call; a backend never checks user input, never pools and never
//!   panics (a missing runtime is [`Error::DriverNotFound`]).
//! - The typed layer, generic over `B: Backend`: [`Memory`], [`UnownedMemory`],
//!   [`MemoryPointer`] (bounds-checked copies and memsets), [`PinnedMemory`] and
//!   [`PinnedMemoryPointer`], [`Stream`] and [`ExternalStream`], [`Event`], [`Graph`],
//!   [`Device`], and the current device and stream of each thread.
//! - [`pool`]: [`SingleDeviceMemoryPool`] and [`MemoryPool`] with CuPy's rules, generic over a
//!   [`RawAllocator`]; no FFI and no `unsafe` in it. [`PinnedMemoryPool`] for pinned buffers.
//! - [`hooks`]: [`MemoryHook`] and per-thread registration.
//! - [`host`]: the host backend, where device memory is host memory and each stream is a worker
//!   thread. It is the default backend and what CI runs on.
//!
//! # Safety
//!
//! `unsafe` lives in the modules that must touch raw memory or FFI trampolines (memory,
//! transfers, pinned memory, callbacks, the host backend); each `unsafe` block names the invariant
//! it relies on. The pool, streams, events, hooks and allocator modules are safe code.
//!
//! # Example
//!
//! ```
//! use gpumem_core::host::Host;
//! use gpumem_core::{MemoryPool, Stream};
//!
//! let pool = MemoryPool::<Host>::new();
//! let p = pool.malloc(1000)?; // rounded to 1024 bytes
//! p.memset(7, 1000)?;
//! let mut back = vec![0u8; 1000];
//! p.copy_to_host(&mut back, 1000)?;
//! assert!(back.iter().all(|&b| b == 7));
//! assert_eq!(pool.used_bytes(), 1024);
//!
//! let s = Stream::<Host>::non_blocking()?;
//! (&p + 10).memset_async(1, 10, Some(&s))?;
//! s.synchronize()?;
//! # Ok::<(), gpumem_core::Error>(())
//! ```

#![deny(unsafe_code)]

pub mod allocator;
#[allow(unsafe_code)]
pub mod backend;
mod callback;
mod context;
mod device;
pub mod error;
mod event;
mod graph;
pub mod hooks;
pub mod host;
#[allow(unsafe_code)]
mod memory;
mod pinned;
pub mod pool;
#[allow(unsafe_code)]
mod stream;
#[allow(unsafe_code)]
mod transfer;

pub use allocator::{
    alloc, get_allocator, get_default_memory_pool, get_default_pinned_memory_pool, set_allocator,
    using_allocator, Allocator, AllocatorGuard, PlainAllocator,
};
pub use backend::{
    Backend, CaptureMode, CaptureStatus, DeviceId, DeviceProperties, DevicePtr, EventFlags, HostFn, MemInfo,
    StreamCallback, StreamFlags,
};
pub use context::{Globals, ThreadState};
pub use device::{Device, DeviceGuard};
pub use error::{Error, HookError, Result};
pub use event::{get_elapsed_time, Event};
pub use graph::Graph;
pub use hooks::{AllocEvent, FreeEvent, HookGuard, HookResult, MallocEvent, MemoryHook};
pub use memory::{BaseMemory, Memory, MemoryPointer, UnownedMemory};
pub use pinned::{
    PinnedAllocator, PinnedBuffer, PinnedMemory, PinnedMemoryPointer, PinnedMemoryPool,
    RuntimePinnedAllocator,
};
pub use pool::{
    round_size, DeviceAllocator, GrowthPolicy, Limit, MemoryPool, PooledMemory, RawAllocator,
    SingleDeviceMemoryPool, ALLOCATION_UNIT_SIZE, LIMIT_ENV,
};
pub use stream::{
    ExternalStream, Stream, StreamGuard, StreamOptions, LEGACY_STREAM_PTR, NULL_STREAM_PTR,
    PER_THREAD_STREAM_PTR,
};
pub use transfer::CopySource;
