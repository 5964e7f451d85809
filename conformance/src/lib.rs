//! gpumem's conformance suite: one body of tests, instantiated for every backend a build has.
//!
//! Each backend's tests call [`suite!`] once with its backend type:
//!
//! ```ignore
//! gpumem_conformance::suite!(gpumem_cuda::Cuda, on_device);
//! ```
//!
//! The second argument says how the tests run. `always`: every test runs (the host backend,
//! which needs no device). `on_device`: every test is marked ignored, so a machine without the
//! device shows the suite as not run instead of passing; a machine with one runs it with
//! `--include-ignored`, and there a test that finds no device fails.
//!
//! The bodies are written against a small facade module named `gpumem` that [`suite!`] declares
//! for the backend (the same names as the `gpumem` crate's aliases), so one body serves every
//! backend. What a backend cannot do is read from its capabilities ([`gpumem_core::Api::CAPS`]),
//! never from its name.

mod allocator;
mod async_pool;
pub mod backend;
mod buffers;
mod capture;
mod devices;
mod events;
mod fork_join;
mod memory;
pub mod no_device;
mod pinned;
mod pool;
mod safety;
mod share;
mod staging;
mod streams;
mod vmm;

use gpumem_core::{MemoryPointer, Runtime};

/// Instantiates the whole suite for backend `$backend` (`always` or `on_device`; see the crate
/// docs).
#[macro_export]
macro_rules! suite {
    ($backend:ty, $flavor:ident) => {
        /// The facade the test bodies are written against, for this backend.
        #[allow(dead_code, unused_imports)]
        mod gpumem {
            pub use $crate::__private::core;
            pub use $crate::__private::core::{
                BaseMemory, Error, EventFlags, Limit, PageableStaging, PlainAllocator, Result, StreamOptions,
                ALLOCATION_UNIT_SIZE,
            };
            pub type DefaultBackend = $backend;
            pub type CopySource<'a> = core::CopySource<'a, $backend>;
            pub type Device = core::Device<$backend>;
            pub type DeviceBuffer<T> = core::DeviceBuffer<T, $backend>;
            pub type Event = core::Event<$backend>;
            pub type ExternalStream = core::ExternalStream<$backend>;
            pub type Memory = core::Memory<$backend>;
            pub type MemoryAsync = core::MemoryAsync<$backend>;
            pub type MemoryAsyncPool = core::MemoryAsyncPool<$backend>;
            pub type MemoryPointer = core::MemoryPointer<$backend>;
            pub type MemoryPool = core::MemoryPool<$backend>;
            pub type PinnedMemoryPointer = core::PinnedMemoryPointer<$backend>;
            pub type PinnedMemoryPool = core::PinnedMemoryPool<$backend>;
            pub type Stream = core::Stream<$backend>;
            pub type UnownedMemory = core::UnownedMemory<$backend>;

            pub fn alloc(size: usize) -> Result<MemoryPointer> {
                core::alloc::<$backend>(size)
            }
            pub fn malloc_async(size: usize) -> Result<MemoryPointer> {
                core::malloc_async::<$backend>(size)
            }
            pub fn using_allocator(
                allocator: Option<std::sync::Arc<dyn core::Allocator<$backend>>>,
            ) -> core::AllocatorGuard<$backend> {
                core::using_allocator::<$backend>(allocator)
            }
            pub fn set_allocator(
                allocator: Option<std::sync::Arc<dyn core::Allocator<$backend>>>,
            ) -> Result<()> {
                core::set_allocator::<$backend>(allocator)
            }
            pub fn get_current_stream() -> Stream {
                Stream::current()
            }
            pub fn get_elapsed_time(start: &Event, end: &Event) -> Result<f32> {
                core::get_elapsed_time(start, end)
            }
        }

        /// Fails the test when the backend has no device.
        fn require_device() {
            $crate::require_device::<$backend>();
        }

        /// Whether the backend captures streams.
        fn supports_capture() -> bool {
            <$backend as $crate::__private::core::Api>::CAPS.capture
        }

        $crate::__allocator_tests!($flavor);
        $crate::__async_pool_tests!($flavor);
        $crate::__backend_tests!($flavor);
        $crate::__buffers_tests!($flavor);
        $crate::__capture_tests!($flavor);
        $crate::__devices_tests!($flavor);
        $crate::__events_tests!($flavor);
        $crate::__fork_join_tests!($flavor);
        $crate::__memory_tests!($flavor);
        $crate::__pinned_tests!($flavor);
        $crate::__pool_tests!($flavor);
        $crate::__safety_tests!($flavor);
        $crate::__share_tests!($flavor);
        $crate::__staging_tests!($flavor);
        $crate::__streams_tests!($flavor);
        $crate::__vmm_tests!($flavor);
    };
}

/// Declares tests that always run (`suite!(B, always)`).
#[macro_export]
#[doc(hidden)]
macro_rules! always {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {$(
        #[test]
        $(#[$meta])*
        fn $name() {
            super::require_device();
            $body
        }
    )*};
}

/// Declares tests that need a device and show as not run without one (`suite!(B, on_device)`).
#[macro_export]
#[doc(hidden)]
macro_rules! on_device {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {$(
        #[test]
        #[ignore = "needs a GPU: run with --include-ignored on a machine that has one"]
        $(#[$meta])*
        fn $name() {
            super::require_device();
            $body
        }
    )*};
}

/// Fails the calling test when backend `B` has no device.
///
/// # Panics
///
/// When the backend reports no device (that is the point: a test that needs one fails).
pub fn require_device<B: Runtime>() {
    if let Err(e) = gpumem_core::Device::<B>::count() {
        panic!("the {} backend has no device: {e}", B::NAME);
    }
}

/// Reads `n` bytes back from device memory.
///
/// # Panics
///
/// When the copy fails.
pub fn read<B: Runtime>(p: &MemoryPointer<B>, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    p.copy_to_host(&mut out, n).expect("copy_to_host");
    out
}

/// Serialises the tests that capture with the tests that synchronise a whole device: CUDA refuses
/// a device-wide synchronisation while any stream of the device captures, and tests run in
/// parallel.
pub fn capture_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serialises the tests of the stream-ordered allocator: its statistics are the device's, shared
/// by every test of the process.
pub fn async_pool_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serialises the tests that change the process-wide pinned allocator.
pub fn pinned_allocator_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the macros name; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use gpumem_core as core;
}
