//! [`Runtime`]: a backend with every layer of the typed layer's state, and
//! [`runtime_statics!`](crate::runtime_statics), which declares that state for a backend.
//!
//! Each layer of the typed layer keeps its own per-thread and per-process state and reaches it
//! through its own trait: `StateRuntime` (the current device, deferred errors), `StreamRuntime`
//! (the current streams, what queued work keeps alive), `AllocatorRuntime` (the current
//! allocators, the default pools). A lower layer cannot name a higher one's state, so the layers
//! import downwards only. `Runtime` is all of them: the bound a program names.

use crate::runtime::allocator::AllocatorRuntime;

/// A backend the typed layer can run on: a [`Backend`](crate::hal::Backend) with the typed
/// layer's per-thread and per-process state. Every type of the typed layer (`MemoryPointer<B>`,
/// `Stream<B>`, the pools) works over any `B: Runtime`.
///
/// A backend gets it, with the state of each layer, from
/// [`runtime_statics!`](crate::runtime_statics):
///
/// ```ignore
/// gpumem_core::runtime_statics!(MyBackend);
/// ```
pub trait Runtime: AllocatorRuntime {}

impl<B: AllocatorRuntime> Runtime for B {}

/// Makes a [`Backend`](crate::hal::Backend) a [`Runtime`]: declares its thread-local and
/// process-wide state, one of each per layer. Use it once per backend, as an item.
#[macro_export]
macro_rules! runtime_statics {
    ($backend:ty) => {
        impl $crate::__private::StateRuntime for $backend {
            fn thread_state() -> &'static ::std::thread::LocalKey<$crate::__private::ThreadState> {
                ::std::thread_local! {
                    static STATE: $crate::__private::ThreadState = const { $crate::__private::ThreadState::new() };
                }
                &STATE
            }

            fn globals() -> &'static $crate::__private::Globals {
                static GLOBALS: $crate::__private::Globals = $crate::__private::Globals::new();
                &GLOBALS
            }
        }

        impl $crate::__private::StreamRuntime for $backend {
            fn stream_thread() -> &'static ::std::thread::LocalKey<$crate::__private::StreamThread<$backend>> {
                ::std::thread_local! {
                    static STATE: $crate::__private::StreamThread<$backend> =
                        const { $crate::__private::StreamThread::new() };
                }
                &STATE
            }

            fn stream_globals() -> &'static $crate::__private::StreamGlobals<$backend> {
                static GLOBALS: ::std::sync::OnceLock<$crate::__private::StreamGlobals<$backend>> =
                    ::std::sync::OnceLock::new();
                GLOBALS.get_or_init($crate::__private::StreamGlobals::new)
            }
        }

        impl $crate::__private::AllocatorRuntime for $backend {
            fn allocator_thread() -> &'static ::std::thread::LocalKey<$crate::__private::AllocatorThread<$backend>> {
                ::std::thread_local! {
                    static STATE: $crate::__private::AllocatorThread<$backend> =
                        const { $crate::__private::AllocatorThread::new() };
                }
                &STATE
            }

            fn allocator_globals() -> &'static $crate::__private::AllocatorGlobals<$backend> {
                static GLOBALS: ::std::sync::OnceLock<$crate::__private::AllocatorGlobals<$backend>> =
                    ::std::sync::OnceLock::new();
                GLOBALS.get_or_init($crate::__private::AllocatorGlobals::new)
            }
        }
    };
}
