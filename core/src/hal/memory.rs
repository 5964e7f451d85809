//! Device and pinned memory, the stream-ordered allocator, copies and memsets.

use crate::error::Result;
use crate::hal::types::{AsyncPoolAttribute, DeviceId, DevicePtr};
use crate::hal::Api;

/// Memory operations. See the [contract](crate::hal).
pub trait MemoryOps: Api {
    /// Allocates `size > 0` bytes of device memory on `dev`, aligned to at least 256 bytes.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the device is out of memory; the runtime's error otherwise.
    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr>;
    /// Frees memory from [`Self::malloc`].
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
    /// Frees memory from [`Self::malloc_host`].
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
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` where the runtime or device has no stream-ordered allocator;
    /// `OutOfMemory`; the runtime's error.
    unsafe fn malloc_async(dev: DeviceId, size: usize, stream: Self::Stream) -> Result<DevicePtr>;
    /// Frees memory from [`Self::malloc_async`], ordered on `stream`.
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

    /// Reads an attribute of the device's default stream-ordered pool, the one
    /// [`Self::malloc_async`] allocates from.
    ///
    /// # Errors
    ///
    /// `Unsupported` where the runtime or device has no stream-ordered allocator; the runtime's
    /// error.
    fn async_pool_attribute(dev: DeviceId, attribute: AsyncPoolAttribute) -> Result<u64>;
    /// Sets the release threshold of the device's default stream-ordered pool: the free bytes it
    /// keeps cached when the runtime synchronises (`u64::MAX`: all of them).
    ///
    /// # Errors
    ///
    /// `Unsupported` where the runtime or device has no stream-ordered allocator; the runtime's
    /// error.
    fn async_pool_set_release_threshold(dev: DeviceId, bytes: u64) -> Result<()>;
    /// Releases the free memory the device's default stream-ordered pool holds, keeping at least
    /// `keep` bytes reserved (`cuMemPoolTrimTo`). Memory freed on a stream is released only once
    /// the stream has reached the free.
    ///
    /// # Errors
    ///
    /// `Unsupported` where the runtime or device has no stream-ordered allocator; the runtime's
    /// error.
    fn async_pool_trim_to(dev: DeviceId, keep: usize) -> Result<()>;

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
    /// As [`Self::memcpy`], until the stream reaches the copy; host memory is pinned.
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
    /// As [`Self::memset`], until the stream reaches it.
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

    /// Whether large synchronous copies of pageable host memory should go through pinned
    /// staging buffers, in pipelined chunks, instead of [`Self::memcpy`] alone: true where the
    /// runtime copies pageable memory much slower than pinned memory (its own staging is
    /// serial), as CUDA and HIP do. The typed layer decides the sizes; this only says whether
    /// staging can win at all. The default is `true`; a backend whose device memory is host
    /// memory says `false` (staging would only add a copy).
    fn stages_pageable_copies() -> bool {
        true
    }
}
