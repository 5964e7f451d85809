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
        $crate::runtime_statics!(@layer $backend, StateRuntime, thread_state, ThreadState, globals, Globals);
        $crate::runtime_statics!(
            @layer $backend, StreamRuntime, stream_thread, StreamThread<$backend>, stream_globals,
            StreamGlobals<$backend>
        );
        $crate::runtime_statics!(
            @layer $backend, AllocatorRuntime, allocator_thread, AllocatorThread<$backend>,
            allocator_globals, AllocatorGlobals<$backend>
        );
    };
    // One layer's trait: a thread-local of its thread state (made in a `const` block, so its
    // reads need no lazy initialisation) and a static of its process state.
    (@layer $backend:ty, $layer:ident, $thread:ident, $thread_ty:ident $(<$t:ty>)?, $globals:ident,
     $globals_ty:ident $(<$g:ty>)?) => {
        impl $crate::__private::$layer for $backend {
            fn $thread() -> &'static ::std::thread::LocalKey<$crate::__private::$thread_ty $(<$t>)?> {
                ::std::thread_local! {
                    static STATE: $crate::__private::$thread_ty $(<$t>)? =
                        const { $crate::__private::$thread_ty::new() };
                }
                &STATE
            }

            fn $globals() -> &'static $crate::__private::$globals_ty $(<$g>)? {
                static GLOBALS: ::std::sync::OnceLock<$crate::__private::$globals_ty $(<$g>)?> =
                    ::std::sync::OnceLock::new();
                GLOBALS.get_or_init($crate::__private::$globals_ty::new)
            }
        }
    };
}
