//! gpumem: a caching GPU memory runtime for Rust, on CUDA, HIP or the host.
//!
//! gpumem is CuPy's device-memory runtime rebuilt in Rust: a caching memory pool whose cache hit
//! costs tens of nanoseconds, memory hooks, bounds-checked memory pointers, streams, events and
//! graph capture. The same program runs on NVIDIA GPUs (`--features cuda`), AMD GPUs
//! (`--features hip`) or, with neither, on the CPU.
//!
//! # Start here
//!
//! | to | start from |
//! | --- | --- |
//! | allocate from a caching pool | [`MemoryPool`] (`malloc`, `stats`, `set_limit`, `set_growth_policy`); [`alloc`] with the process-wide allocator |
//! | hold typed data | [`DeviceBuffer`] (`from_slice`, `slice`, `fill_async`, `to_vec`) |
//! | copy and set bytes, with bounds checks | [`MemoryPointer`] (what `malloc` returns) |
//! | order and overlap work | [`Stream`], [`Event`], [`Graph`] |
//! | see the allocations | [`DebugPrintHook`], [`Recorder`], [`LineProfileHook`], [`hooks`] |
//! | handle what went wrong | [`Error`] |
//!
//! The guides walk through them: [the pool](guide::pool), [streams and events](guide::streams),
//! [safety](guide::safety), [statistics](guide::statistics), [traces](guide::traces); then
//! [backends and the environment](guide::environment), [C and Python](guide::c_and_python) and
//! [what has been verified where](guide::verification).
//!
//! These names are aliases for the build's default backend (`cuda`, else `hip`, else `host`;
//! with the `auto` feature, the one chosen at run time). Every enabled backend is also reachable
//! by name: [`host`], and `cuda` / `hip` when their features are on; the generic types are in
//! [`core`].
//!
//! # Example
//!
//! Every type takes its backend; the aliases at the top of this crate (`gpumem::MemoryPool`,
//! `gpumem::Stream`, ...) name the default one. This example names the host backend, so it runs
//! on any machine whatever the features (the README's quick start uses the aliases):
//!
//! ```
//! use gpumem::core::{MemoryPool, Stream};
//! use gpumem::host::Host;
//!
//! let pool = MemoryPool::<Host>::new();
//! let a = pool.malloc(1024)?;
//! a.copy_from_host(&[1, 2, 3, 4], 4)?;
//! let b = pool.malloc(1024)?;
//! b.copy_from_device(&a, 4)?;
//!
//! let stream = Stream::<Host>::non_blocking()?;
//! (&b + 4).memset_async(9, 4, Some(&stream))?;
//! stream.synchronize()?;
//!
//! let mut out = [0u8; 8];
//! b.copy_to_host(&mut out, 8)?;
//! assert_eq!(out, [1, 2, 3, 4, 9, 9, 9, 9]);
//!
//! // Out of range is an error, not memory corruption.
//! assert!((&b + 1020).memset(0, 8).is_err());
//! # Ok::<(), gpumem::Error>(())
//! ```
//!
//! # Backends
//!
//! | | host (default) | cuda | hip |
//! |---|---|---|---|
//! | memory, pool, hooks, copies, memsets | yes | yes | yes |
//! | streams, events, callbacks, host functions | yes | yes | yes |
//! | stream capture and graphs | yes | yes | no: [`Error::Unsupported`] |
//! | stream-ordered allocator | yes | yes (`cuMemAllocAsync`) | where the runtime has it |
//!
//! # Features
//!
//! `cuda` and `hip` add those backends. `auto` makes the aliases name `gpumem::auto::Auto`, the
//! backend chosen when the program starts (CUDA where the driver finds a device, else HIP, else
//! the host; `GPUMEM_BACKEND=host` forces the CPU), so one binary built with `cuda,auto` runs on a
//! GPU node and on a laptop. `line-profile` (on by default) adds [`LineProfileHook`],
//! which walks the call stack with the `backtrace` crate (without it gpumem does not depend on
//! `backtrace`).

// docs.rs marks the items that need a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without `line-profile` the docs still name LineProfileHook, which is then absent.
#![cfg_attr(not(feature = "line-profile"), allow(rustdoc::broken_intra_doc_links))]

/// The README's examples, run as doc tests where the default backend is the host: with `cuda` or
/// `hip` the default backend would need a GPU, so they are left out there (the host job runs them).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, not(any(feature = "cuda", feature = "hip"))))]
pub struct ReadmeDoctests;

pub mod guide;

pub use bytemuck;
pub use gpumem_core as core;
pub use gpumem_core::hal::{
    AsyncPoolAttribute, Backend, Caps, CaptureMode, CaptureStatus, DeviceId, DeviceProperties, DevicePtr,
    EventFlags, MemInfo, StreamFlags,
};
pub use gpumem_core::hooks::{self, AllocEvent, FreeEvent, HookGuard, HookResult, MallocEvent, MemoryHook};
pub use gpumem_core::{
    round_size, set_pageable_staging, take_deferred_error, Allocator, BaseMemory, CopySource, Error,
    FnAllocator, GrowthPolicy, HookError, Limit, PageableStaging, PageableStagingGuard, PinnedAllocator,
    PinnedBuffer, PinnedMemoryAllocator, PlainAllocator, PlainPinnedAllocator, RawAllocator, RawBlock,
    Result, Runtime, StagingCounts, StreamOptions, ALLOCATION_UNIT_SIZE, LIMIT_ENV, PAGEABLE_STAGING_ENV,
};
#[cfg(feature = "line-profile")]
pub use gpumem_hooks::{humanized_size, LineProfileHook, ProfileEntry, StackFrame};
pub use gpumem_hooks::{DebugPrintHook, Recorder, RecorderGuard};

/// The backend chosen at run time among those built in: CUDA where its driver finds a device,
/// else HIP, else the host; `GPUMEM_BACKEND=cuda|hip|host` overrides. Use it as any backend:
/// `gpumem::core::MemoryPool::<gpumem::auto::Auto>::new()`.
#[cfg(any(feature = "cuda", feature = "hip", feature = "auto"))]
pub use gpumem_auto as auto;
/// The host backend (always available).
pub use gpumem_core::host;
/// The CUDA backend.
#[cfg(feature = "cuda")]
pub use gpumem_cuda as cuda;
/// The HIP backend.
#[cfg(feature = "hip")]
pub use gpumem_hip as hip;

cfg_if::cfg_if! {
    if #[cfg(feature = "auto")] {
        /// The backend this build uses by default: the one chosen at run time among those built in
        /// (the `auto` feature; see [`auto`]). `GPUMEM_BACKEND=host` runs a CUDA build on the CPU.
        pub type DefaultBackend = gpumem_auto::Auto;
    } else if #[cfg(feature = "cuda")] {
        /// The backend this build uses by default: CUDA.
        pub type DefaultBackend = gpumem_cuda::Cuda;
    } else if #[cfg(feature = "hip")] {
        /// The backend this build uses by default: HIP.
        pub type DefaultBackend = gpumem_hip::Hip;
    } else {
        /// The backend this build uses by default: the host.
        pub type DefaultBackend = gpumem_core::host::Host;
    }
}

/// `len` elements of a plain-old-data `T` in device memory of the default backend, from the
/// current allocator (see [`gpumem_core::runtime::buffer`]).
pub type DeviceBuffer<T> = gpumem_core::DeviceBuffer<T, DefaultBackend>;
/// A device of the default backend (CuPy's `cupy.cuda.Device`).
pub type Device = gpumem_core::Device<DefaultBackend>;
/// The default backend's device allocator (each raw block a [`Memory`]).
pub type DeviceAllocator = gpumem_core::DeviceAllocator<DefaultBackend>;
/// Restores the previous device when dropped.
pub type DeviceGuard = gpumem_core::DeviceGuard<DefaultBackend>;
/// One raw device allocation (CuPy's `Memory`).
pub type Memory = gpumem_core::Memory<DefaultBackend>;
/// Foreign device memory kept alive through an owner (CuPy's `UnownedMemory`).
pub type UnownedMemory = gpumem_core::UnownedMemory<DefaultBackend>;
/// A chunk lent by a pool (CuPy's `PooledMemory`).
pub type PooledMemory = gpumem_core::PooledMemory<DeviceAllocator>;
/// A pointer into device memory (CuPy's `MemoryPointer`).
pub type MemoryPointer = gpumem_core::MemoryPointer<DefaultBackend>;
/// One pinned host allocation (CuPy's `PinnedMemory`).
pub type PinnedMemory = gpumem_core::PinnedMemory<DefaultBackend>;
/// A pointer into pinned host memory (CuPy's `PinnedMemoryPointer`).
pub type PinnedMemoryPointer = gpumem_core::PinnedMemoryPointer<DefaultBackend>;
/// The pinned memory pool (CuPy's `PinnedMemoryPool`).
pub type PinnedMemoryPool = gpumem_core::PinnedMemoryPool<DefaultBackend>;
/// The pool of one device (CuPy's `SingleDeviceMemoryPool`).
pub type SingleDeviceMemoryPool = gpumem_core::SingleDeviceMemoryPool<DefaultBackend>;
/// One pool per device (CuPy's `MemoryPool`).
pub type MemoryPool = gpumem_core::MemoryPool<DefaultBackend>;
/// A stream (CuPy's `Stream`).
pub type Stream = gpumem_core::Stream<DefaultBackend>;
/// A stream gpumem never destroys (CuPy's `ExternalStream`).
pub type ExternalStream = gpumem_core::ExternalStream<DefaultBackend>;
/// Restores the previous current stream when dropped (CuPy's `with stream:`).
pub type StreamGuard = gpumem_core::StreamGuard<DefaultBackend>;
/// An event (CuPy's `Event`).
pub type Event = gpumem_core::Event<DefaultBackend>;
/// An instantiated graph (CuPy's `Graph`).
pub type Graph = gpumem_core::Graph<DefaultBackend>;
/// Ends a `using_allocator` scope when dropped.
pub type AllocatorGuard = gpumem_core::AllocatorGuard<DefaultBackend>;
/// Memory from the runtime's stream-ordered allocator (CuPy's `MemoryAsync`).
pub type MemoryAsync = gpumem_core::MemoryAsync<DefaultBackend>;
/// The runtime's stream-ordered pool of every device (CuPy's `MemoryAsyncPool`).
pub type MemoryAsyncPool = gpumem_core::MemoryAsyncPool<DefaultBackend>;

/// Allocates `size` bytes on the current device with the runtime's stream-ordered allocator,
/// ordered on the current stream (CuPy's `malloc_async`).
///
/// # Errors
///
/// As [`gpumem_core::MemoryAsync::new`]: `Unsupported` where there is no stream-ordered
/// allocator, `OutOfMemory`, the runtime's error.
pub fn malloc_async(size: usize) -> Result<MemoryPointer> {
    gpumem_core::malloc_async::<DefaultBackend>(size)
}

/// Sets the process-wide pinned allocator (CuPy's `set_pinned_memory_allocator`); `None` selects
/// unpooled pinned memory. [`reset_pinned_memory_allocator`] restores the default pinned pool.
pub fn set_pinned_memory_allocator(
    allocator: Option<std::sync::Arc<dyn PinnedMemoryAllocator<DefaultBackend>>>,
) {
    gpumem_core::set_pinned_memory_allocator::<DefaultBackend>(allocator);
}

/// Makes the default pinned memory pool the pinned allocator again.
pub fn reset_pinned_memory_allocator() {
    gpumem_core::reset_pinned_memory_allocator::<DefaultBackend>();
}

/// The pinned allocator [`alloc_pinned_memory`] uses.
#[must_use]
pub fn get_pinned_memory_allocator() -> std::sync::Arc<dyn PinnedMemoryAllocator<DefaultBackend>> {
    gpumem_core::get_pinned_memory_allocator::<DefaultBackend>()
}

/// Allocates `size` bytes of pinned host memory with the current pinned allocator (CuPy's
/// `alloc_pinned_memory`).
///
/// # Errors
///
/// The allocator's: `OutOfMemory`, the runtime's error.
pub fn alloc_pinned_memory(size: usize) -> Result<PinnedMemoryPointer> {
    gpumem_core::alloc_pinned_memory::<DefaultBackend>(size)
}

/// Allocates `size` bytes on the current device with the current allocator (CuPy's
/// `cupy.cuda.alloc`; by default the default memory pool).
///
/// # Errors
///
/// The allocator's: `OutOfMemory`, `LimitExceeded`, a hook's error.
pub fn alloc(size: usize) -> Result<MemoryPointer> {
    gpumem_core::alloc::<DefaultBackend>(size)
}

/// The default memory pool (CuPy's `get_default_memory_pool()`).
#[must_use]
pub fn get_default_memory_pool() -> std::sync::Arc<MemoryPool> {
    gpumem_core::get_default_memory_pool::<DefaultBackend>()
}

/// The default pinned memory pool (CuPy's `get_default_pinned_memory_pool()`).
#[must_use]
pub fn get_default_pinned_memory_pool() -> std::sync::Arc<PinnedMemoryPool> {
    gpumem_core::get_default_pinned_memory_pool::<DefaultBackend>()
}

/// Sets the process-wide allocator (CuPy's `set_allocator`); `None` disables pooling.
///
/// # Errors
///
/// [`Error::AllocatorInUse`] inside a [`using_allocator`] scope.
pub fn set_allocator(allocator: Option<std::sync::Arc<dyn Allocator<DefaultBackend>>>) -> Result<()> {
    gpumem_core::set_allocator::<DefaultBackend>(allocator)
}

/// The allocator [`alloc`] uses on this thread (CuPy's `get_allocator`).
#[must_use]
pub fn get_allocator() -> std::sync::Arc<dyn Allocator<DefaultBackend>> {
    gpumem_core::get_allocator::<DefaultBackend>()
}

/// Uses `allocator` on this thread until the guard is dropped (CuPy's `using_allocator`).
pub fn using_allocator(allocator: Option<std::sync::Arc<dyn Allocator<DefaultBackend>>>) -> AllocatorGuard {
    gpumem_core::using_allocator::<DefaultBackend>(allocator)
}

/// The current stream of the current device on this thread (CuPy's `get_current_stream()`).
#[must_use]
pub fn get_current_stream() -> Stream {
    Stream::current()
}

/// Milliseconds between two recorded events (CuPy's `get_elapsed_time`).
///
/// # Errors
///
/// As [`gpumem_core::get_elapsed_time`].
pub fn get_elapsed_time(start: &Event, end: &Event) -> Result<f32> {
    gpumem_core::get_elapsed_time(start, end)
}
