//! gpumem's core: the backend contract, the typed API over it, the caching memory pool, memory
//! hooks, and the host backend.
//!
//! Most programs use the `gpumem` facade crate, which picks a backend and exports this crate's
//! types under CuPy's names (`gpumem::MemoryPointer`, `gpumem::Stream`, ...). This crate is what
//! backends and the facade are built on.
//!
//! # How it is cut
//!
//! Four layers; each imports only the layers below it (`tests/layers.rs` checks it):
//!
//! 0. [`error`]: the one error type.
//! 1. [`hal`]: the backend contract. A backend is a marker type implementing [`hal::Api`] and
//!    one trait per concern ([`DeviceOps`], [`MemoryOps`], [`StreamOps`], [`EventOps`],
//!    [`GraphOps`]). **Backends translate; the typed layer validates.** Bounds, device matching,
//!    capture state and flag combinations are checked once, in the typed layer, before any
//!    backend call; a backend never checks user input, never pools and never panics (a missing
//!    runtime is [`Error::DriverNotFound`]). Beside it, [`hooks`]: [`MemoryHook`] and per-thread
//!    registration.
//! 2. [`pool`]: the caching pool as a data structure ([`pool::Pool`]), generic over a
//!    [`RawAllocator`] and its block type; it knows sizes, addresses, arena keys and fences, and
//!    no backend, stream or memory type.
//! 3. [`runtime`]: the typed layer, the only code generic over a backend (`B: `[`Runtime`]):
//!    [`Memory`], [`UnownedMemory`], [`MemoryPointer`] (bounds-checked copies and memsets),
//!    [`PinnedMemory`] and [`PinnedMemoryPointer`], [`SingleDeviceMemoryPool`] and
//!    [`MemoryPool`], [`Stream`] and [`ExternalStream`], [`Event`], [`Graph`], [`Device`], and
//!    the current device and stream of each thread. Its modules are layered the same way
//!    (`state`, `memory`, `stream`, `device`, `device_allocator`, `pointer`, `pinned`, `pools`,
//!    `allocator`, then `buffer`, `staging` and `transfer` over [`Runtime`]): each layer reaches
//!    its own per-thread and per-process state through its own trait, so none names a higher
//!    one's.
//!
//! [`host`] is a backend like the others (the same file names as the CUDA and HIP backends): the
//! default one, where device memory is host memory and each stream is a worker thread.
//!
//! # What keeps memory alive
//!
//! Every asynchronous operation keeps alive what it touches (the memory behind a
//! [`MemoryPointer`] or a [`DeviceBuffer`], a pinned buffer) until its stream has passed it: an
//! event is recorded behind the operation, and what it keeps is released once the event has
//! completed. Dropping the last handle a program holds therefore never frees, or lends again,
//! bytes that queued work can still reach; a pool chunk released this way goes back to the pool
//! only then. A synchronous access waits for queued work on the same bytes, and work queued on
//! another stream is ordered after it, so two accesses through gpumem never race, from one
//! thread or several: while a synchronous access runs, a call of another thread that queues work
//! on its bytes, or accesses them, waits until it has ended. Memory reached only through raw
//! addresses (a kernel of the program's own) is kept with [`MemoryPointer::record_stream`]. Frees wait for nothing else: no stream is drained, and a
//! free inside a host function or callback is carried out later, on a user thread.
//!
//! ## Graph-owned memory
//!
//! While a stream captures, what its operations touch goes to the capture and then to its
//! [`Graph`], which holds it until the graph is dropped (after its queued replays); streams that
//! join the capture through an event hand theirs to the same graph. Host functions captured into
//! a graph belong to it the same way. Within a capture, memory the capture touched on its own
//! stream alone and whose pointers were dropped during the capture is lent again to the
//! capture's later allocations from the same pool (as PyTorch's private graph pools): a replay
//! runs the stream's work in captured order, so the reuse is ordered after the earlier uses. It
//! is never lent to work outside the capture while the graph lives. Such reuse does not pass
//! through the pool, so the memory hooks and the pool's statistics do not see it.
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

pub mod env;
pub mod error;
#[allow(unsafe_code)] // declares the contract's unsafe operations
pub mod hal;
pub mod hooks;
mod policy_names;
pub mod pool;
pub mod runtime;
pub mod trace;

#[allow(unsafe_code)]
pub mod host;

pub use error::{Error, HookError, Result, MAX_ALLOCATION_SIZE};
pub use hal::{
    Api, AsyncPoolAttribute, Backend, Caps, CaptureMode, CaptureStatus, DeviceId, DeviceOps,
    DeviceProperties, DevicePtr, EventFlags, EventOps, GraphOps, HostFn, MemInfo, MemoryOps, PhysicalHandle,
    StreamCallback, StreamFlags, StreamOps, VirtualMemoryOps,
};
pub use hooks::{AllocEvent, FreeEvent, HookGuard, HookResult, MallocEvent, MemoryHook};
pub use pool::{
    round_size, ArenaKey, Fence, GrowthPolicy, Limit, OtherStreams, PlanState, PlanStats, PooledMemory,
    RawAllocator, RawBlock, ALLOCATION_UNIT_SIZE, LIMIT_ENV,
};
pub use runtime::allocator::{
    alloc, alloc_pinned_memory, get_allocator, get_default_memory_pool, get_default_pinned_memory_pool,
    get_pinned_memory_allocator, reset_pinned_memory_allocator, set_allocator, set_pinned_memory_allocator,
    using_allocator, Allocator, AllocatorGuard, PinnedMemoryAllocator, PlainAllocator, PlainPinnedAllocator,
};
pub use runtime::buffer::DeviceBuffer;
pub use runtime::device::{Device, DeviceGuard};
pub use runtime::memory::{BaseMemory, Memory, UnownedMemory};
pub use runtime::pinned::{
    PinnedAllocator, PinnedBuffer, PinnedMemory, PinnedMemoryPointer, PinnedMemoryPool,
    RuntimePinnedAllocator,
};
pub use runtime::pointer::MemoryPointer;
pub use runtime::pools::{
    malloc_async, DeviceAllocator, DeviceBlock, FnAllocator, MemoryAsync, MemoryAsyncPool, MemoryPool,
    SingleDeviceMemoryPool,
};
pub use runtime::staging::{
    set_pageable_staging, PageableStaging, PageableStagingGuard, StagingCounts, DEFAULT_STAGING_CHUNK,
    DEFAULT_STAGING_THRESHOLD, MAX_STAGING_LANES, PAGEABLE_STAGING_ENV,
};
pub use runtime::state::{take_deferred_error, PER_THREAD_DEFAULT_STREAM_ENV};
pub use runtime::statics::Runtime;
pub use runtime::stream::event::{get_elapsed_time, Event};
pub use runtime::stream::graph::Graph;
pub use runtime::stream::{
    ExternalStream, Stream, StreamGuard, StreamOptions, LEGACY_STREAM_PTR, NULL_STREAM_PTR,
    PER_THREAD_STREAM_PTR,
};
pub use runtime::transfer::CopySource;

/// What the [`runtime_statics!`] macro names in a backend crate; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::runtime::allocator::{AllocatorGlobals, AllocatorRuntime, AllocatorThread};
    pub use crate::runtime::state::{Globals, StateRuntime, ThreadState};
    pub use crate::runtime::stream::state::{StreamGlobals, StreamThread};
    pub use crate::runtime::stream::StreamRuntime;
}

/// Where this crate's sources are: the `src` directory of its package, as the absolute path the
/// compiler read them from. Unless the build remaps paths, every file name the debug info gives
/// for this crate's code lies under it. gpumem-hooks reads it to tell the pool's frames from the
/// user's where the debug info names functions without their module path
/// (`debug = "line-tables-only"`). Not part of the API.
#[doc(hidden)]
pub const SOURCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
