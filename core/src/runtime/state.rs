//! The typed layer's per-backend state: the current device, the current stream of each device,
//! the pool's arena cache, the allocator in use and the default pools, per thread and per process.
//!
//! `thread_local!` and `static` items cannot be generic, so each backend declares its own with
//! [`runtime_statics!`](crate::runtime_statics) in its `impl Runtime`, and the typed layer reaches
//! them through [`Runtime`]. Two backends in one process therefore never share a current stream or
//! a pool. The state's types are the typed layer's own business: backends only name them in that
//! macro.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::LocalKey;

use parking_lot::RwLock;

use crate::error::Error;
use crate::hal::{Backend, DeviceId};
use crate::pool::{ArenaCache, ArenaKey};
use crate::runtime::allocator::Allocator;
use crate::runtime::pinned::PinnedMemoryPool;
use crate::runtime::pools::MemoryPool;
use crate::runtime::stream::Stream;

/// A marker that keeps a guard on the thread that made it (`!Send`, `!Sync`).
pub(crate) type ThreadBound<B> = PhantomData<(*const (), fn() -> B)>;

/// A backend the typed layer can run on: a [`Backend`] with the typed layer's per-thread and
/// per-process state. Every type of the typed layer (`MemoryPointer<B>`, `Stream<B>`, the pools)
/// is generic over `B: Runtime`.
///
/// Implement it with [`runtime_statics!`](crate::runtime_statics):
///
/// ```ignore
/// impl gpumem_core::Runtime for MyBackend {
///     gpumem_core::runtime_statics!(MyBackend);
/// }
/// ```
pub trait Runtime: Backend {
    /// This thread's state for this backend.
    #[doc(hidden)]
    fn thread_state() -> &'static LocalKey<ThreadState<Self>>;
    /// The process's state for this backend.
    #[doc(hidden)]
    fn globals() -> &'static Globals<Self>;
}

/// Implements [`Runtime`] for a backend: declares its thread-local and process-wide state. Use it
/// as the whole body of `impl Runtime for X`.
#[macro_export]
macro_rules! runtime_statics {
    ($backend:ty) => {
        fn thread_state() -> &'static ::std::thread::LocalKey<$crate::__private::ThreadState<$backend>> {
            ::std::thread_local! {
                static STATE: $crate::__private::ThreadState<$backend> =
                    const { $crate::__private::ThreadState::new() };
            }
            &STATE
        }

        fn globals() -> &'static $crate::__private::Globals<$backend> {
            static GLOBALS: ::std::sync::OnceLock<$crate::__private::Globals<$backend>> =
                ::std::sync::OnceLock::new();
            GLOBALS.get_or_init($crate::__private::Globals::new)
        }
    };
}

/// A thread's copy of the process-wide allocator, with the generation it was read at.
pub(crate) type CachedAllocator<B> = (u64, Arc<dyn Allocator<B>>);

/// One thread's state for backend `B`. Created by [`runtime_statics!`](crate::runtime_statics);
/// its contents are private to the typed layer.
pub struct ThreadState<B: Runtime> {
    /// gpumem's current device for this thread.
    pub(crate) device: Cell<DeviceId>,
    /// The current stream of each device; `None` is the default stream.
    pub(crate) streams: RefCell<Vec<Option<Stream<B>>>>,
    /// The arena key of the current device's current stream: what the pool's hot path reads
    /// ([`ArenaKey::UNSET`] until first read).
    pub(crate) arena_key: Cell<ArenaKey>,
    /// The pool's per-thread cache of arenas.
    pub(crate) arenas: ArenaCache,
    /// The allocators of the `using_allocator` scopes entered on this thread, innermost last.
    pub(crate) allocators: RefCell<Vec<Arc<dyn Allocator<B>>>>,
    /// The process-wide allocator as this thread last read it, with the generation it read
    /// (`Globals::allocator_generation`): `alloc` uses it without the global lock or a reference
    /// count, which threads would otherwise all write to.
    pub(crate) global_allocator: RefCell<Option<CachedAllocator<B>>>,
    /// Captures gpumem began on this thread's per-thread default stream and has not ended:
    /// their device and stream identity. They are ended when the thread exits (see `Drop`).
    pub(crate) per_thread_captures: RefCell<Vec<(DeviceId, ArenaKey)>>,
}

impl<B: Runtime> Drop for ThreadState<B> {
    /// Ends what this thread's per-thread default stream still captures, discarding the graph:
    /// the stream goes with the thread, and CUDA's driver (580.159) crashes when other threads'
    /// legacy-stream work meets a per-thread stream torn down while it captures.
    fn drop(&mut self) {
        for (device, identity) in self.per_thread_captures.get_mut().drain(..) {
            crate::runtime::stream::end_abandoned_capture::<B>(device, identity);
        }
    }
}

impl<B: Runtime> ThreadState<B> {
    /// A fresh thread's state: device 0, every device on its default stream. A `const fn`, so
    /// the thread-local needs no lazy initialisation on the hot path.
    #[must_use]
    pub const fn new() -> Self {
        ThreadState {
            device: Cell::new(0),
            streams: RefCell::new(Vec::new()),
            arena_key: Cell::new(ArenaKey::UNSET),
            arenas: ArenaCache::new(),
            allocators: RefCell::new(Vec::new()),
            global_allocator: RefCell::new(None),
            per_thread_captures: RefCell::new(Vec::new()),
        }
    }

    /// The arena key of the current device's current stream.
    #[inline]
    pub(crate) fn arena_key(&self) -> ArenaKey {
        let key = self.arena_key.get();
        if key == ArenaKey::UNSET {
            self.first_arena_key()
        } else {
            key
        }
    }

    #[cold]
    fn first_arena_key(&self) -> ArenaKey {
        self.refresh_arena_key();
        self.arena_key.get()
    }

    /// The current stream of `dev`, if one was set (`None`: the default stream).
    pub(crate) fn stream_of(&self, dev: DeviceId) -> Option<Stream<B>> {
        self.with_stream_of(dev, Stream::clone)
    }

    /// Applies `f` to the current stream of `dev`, if one was set, without cloning it.
    pub(crate) fn with_stream_of<R>(&self, dev: DeviceId, f: impl FnOnce(&Stream<B>) -> R) -> Option<R> {
        let streams = self.streams.borrow();
        usize::try_from(dev).ok().and_then(|i| streams.get(i)).and_then(Option::as_ref).map(f)
    }

    /// Makes `stream` (`None`: the default) current for `dev` and returns what was current.
    pub(crate) fn replace_stream(&self, dev: DeviceId, stream: Option<Stream<B>>) -> Option<Stream<B>> {
        let Ok(i) = usize::try_from(dev) else {
            return None;
        };
        let old = {
            let mut streams = self.streams.borrow_mut();
            if streams.len() <= i {
                streams.resize_with(i + 1, || None);
            }
            std::mem::replace(&mut streams[i], stream)
        };
        if dev == self.device.get() {
            self.refresh_arena_key();
        }
        old
    }

    /// Recomputes the cached arena key after the device or its stream changed.
    pub(crate) fn refresh_arena_key(&self) {
        let key = match self.stream_of(self.device.get()) {
            Some(s) => s.arena_key(),
            None => default_arena_key(),
        };
        self.arena_key.set(key);
    }
}

impl<B: Runtime> Default for ThreadState<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// A drop or free to run later, elsewhere.
pub(crate) type Deferred = Box<dyn FnOnce() + Send>;

/// Process-wide state for backend `B`. Created by [`runtime_statics!`](crate::runtime_statics).
pub struct Globals<B: Runtime> {
    /// The allocator `alloc` uses when no `using_allocator` scope is active.
    pub(crate) allocator: RwLock<Option<Arc<dyn Allocator<B>>>>,
    /// Raised by every `set_allocator`, after the allocator is replaced: a thread whose copy of
    /// the allocator is of an older generation reads it again.
    pub(crate) allocator_generation: std::sync::atomic::AtomicU64,
    /// The default device memory pool (`get_default_memory_pool`).
    pub(crate) memory_pool: OnceLock<Arc<MemoryPool<B>>>,
    /// The default pinned memory pool (`get_default_pinned_memory_pool`).
    pub(crate) pinned_pool: OnceLock<Arc<PinnedMemoryPool<B>>>,
    /// The pinned allocator `alloc_pinned_memory` uses; `None`: the default pinned pool.
    pub(crate) pinned_allocator: RwLock<Option<Arc<dyn crate::runtime::allocator::PinnedMemoryAllocator<B>>>>,
    /// Number of devices, read once.
    pub(crate) device_count: OnceLock<usize>,
    /// Panics caught in callbacks, by stream raw value, until that stream's next `synchronize`.
    pub(crate) panics: parking_lot::Mutex<Vec<(ArenaKey, String)>>,
    /// What queued work and captures keep alive (see `stream::inflight`).
    pub(crate) inflight: crate::runtime::stream::inflight::InFlight<B>,
    /// The live streams gpumem owns, by arena key (see `stream::owned_stream`).
    pub(crate) owned_streams: parking_lot::Mutex<
        std::collections::HashMap<ArenaKey, std::sync::Weak<crate::runtime::stream::Inner<B>>>,
    >,
    /// Drops that a callback could not do (freeing memory, destroying a handle, waiting),
    /// done at the next `synchronize` or asynchronous operation on a user thread.
    pub(crate) deferred_drops: parking_lot::Mutex<Vec<Deferred>>,
    pub(crate) any_deferred_drops: std::sync::atomic::AtomicBool,
    /// The thread that frees pinned memory (see `free_in_background`); `None` if it could not
    /// start.
    pub(crate) reaper: OnceLock<Option<parking_lot::Mutex<std::sync::mpsc::Sender<Deferred>>>>,
    /// The first error a `Drop` met (a failed free or destroy) since it was last reported: the
    /// next `synchronize` of a stream or device, or [`take_deferred_error`], reports it.
    pub(crate) deferred: parking_lot::Mutex<Option<Error>>,
    /// Whether `deferred` holds an error (read without the lock on every `synchronize`).
    pub(crate) any_deferred: std::sync::atomic::AtomicBool,
}

impl<B: Runtime> Globals<B> {
    /// Empty state; everything is created on first use.
    #[must_use]
    pub fn new() -> Self {
        Globals {
            allocator: RwLock::new(None),
            allocator_generation: std::sync::atomic::AtomicU64::new(0),
            memory_pool: OnceLock::new(),
            pinned_pool: OnceLock::new(),
            pinned_allocator: RwLock::new(None),
            device_count: OnceLock::new(),
            panics: parking_lot::Mutex::new(Vec::new()),
            inflight: crate::runtime::stream::inflight::InFlight::new(),
            owned_streams: parking_lot::Mutex::new(std::collections::HashMap::new()),
            deferred_drops: parking_lot::Mutex::new(Vec::new()),
            any_deferred_drops: std::sync::atomic::AtomicBool::new(false),
            reaper: OnceLock::new(),
            deferred: parking_lot::Mutex::new(None),
            any_deferred: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl<B: Runtime> Default for Globals<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// The environment variable that makes the per-thread default stream the default stream: a flag
/// ([the forms](crate::env)), off by default. CuPy's `CUPY_CUDA_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM_ENV: &str = "GPUMEM_PER_THREAD_DEFAULT_STREAM";

/// Whether the per-thread default stream is the default stream ([`PER_THREAD_DEFAULT_STREAM_ENV`]),
/// read once per process.
///
/// # Errors
///
/// `InvalidEnvironment` for a malformed value, at every call. Each new pool reports it
/// ([`SingleDeviceMemoryPool::with_allocator`](crate::SingleDeviceMemoryPool::with_allocator)).
pub(crate) fn per_thread_default_stream_checked() -> crate::Result<bool> {
    static PTDS: OnceLock<crate::Result<bool>> = OnceLock::new();
    PTDS.get_or_init(|| Ok(crate::env::flag(PER_THREAD_DEFAULT_STREAM_ENV)?.unwrap_or(false))).clone()
}

/// [`per_thread_default_stream_checked`] for the paths that cannot fail: a malformed value is
/// off there (the pools report it).
pub(crate) fn per_thread_default_stream() -> bool {
    per_thread_default_stream_checked().unwrap_or(false)
}

/// Keeps an error met in a `Drop` (which cannot return it) for the next `synchronize` or
/// [`take_deferred_error`], as cudarc records errors from its destructors. The first error is
/// kept; later ones, until it is reported, are dropped.
pub(crate) fn record_drop_error<B: Runtime>(error: Error) {
    let g = B::globals();
    let mut slot = g.deferred.lock();
    if slot.is_none() {
        *slot = Some(error);
        g.any_deferred.store(true, Ordering::Release);
    }
}

/// The error a `Drop` of backend `B` met since the last report (a failed free of device or
/// pinned memory, a failed stream, event or graph destroy), if any; the slot is empty afterwards.
/// `Stream::synchronize` and `Device::synchronize` report it too.
#[must_use]
pub fn take_deferred_error<B: Runtime>() -> Option<Error> {
    let g = B::globals();
    if !g.any_deferred.load(Ordering::Acquire) {
        return None;
    }
    let taken = g.deferred.lock().take();
    g.any_deferred.store(false, Ordering::Release);
    taken
}

/// Runs `drop` now, or, inside a host function or callback (where the runtimes refuse the API
/// calls a drop makes), later on a user thread: at the next `synchronize` or asynchronous
/// operation.
pub(crate) fn drop_outside_callbacks<B: Runtime>(drop: impl FnOnce() + Send + 'static) {
    if crate::runtime::stream::callback::in_callback() {
        let g = B::globals();
        g.deferred_drops.lock().push(Box::new(drop));
        g.any_deferred_drops.store(true, Ordering::Release);
    } else {
        drop();
    }
}

/// Runs `free` on the backend's freeing thread, so that a free the runtime makes wait for the
/// whole device (`cuMemFreeHost` does) never waits on the caller's thread, which a stream may be
/// waiting for (a host function blocked on the caller would then never finish). Falls back to
/// running it here when the thread cannot be started.
pub(crate) fn free_in_background<B: Runtime>(free: Deferred) {
    let g = B::globals();
    let sender = g.reaper.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Deferred>();
        let spawned = std::thread::Builder::new().name(format!("gpumem-{}-free", B::NAME)).spawn(move || {
            for free in rx {
                free();
            }
        });
        spawned.ok().map(|_| parking_lot::Mutex::new(tx))
    });
    match sender {
        Some(tx) => {
            if let Err(std::sync::mpsc::SendError(free)) = tx.lock().send(free) {
                free();
            }
        }
        None => free(),
    }
}

/// Runs the drops deferred from callbacks.
pub(crate) fn run_deferred<B: Runtime>() {
    let g = B::globals();
    if !g.any_deferred_drops.load(Ordering::Acquire) {
        return;
    }
    let drops = std::mem::take(&mut *g.deferred_drops.lock());
    g.any_deferred_drops.store(false, Ordering::Release);
    for d in drops {
        d();
    }
}

/// `Err` with the deferred error of `B`, if one is waiting.
pub(crate) fn check_deferred<B: Runtime>() -> crate::Result<()> {
    take_deferred_error::<B>().map_or(Ok(()), Err)
}

/// The arena key of the default stream: the null stream's 0, or this thread's per-thread key.
pub(crate) fn default_arena_key() -> ArenaKey {
    if per_thread_default_stream() {
        per_thread_arena_key()
    } else {
        ArenaKey::NULL
    }
}

/// The arena key of the calling thread's per-thread default stream: each host thread gets its own
/// arena (CuPy's fix for PTDS, #5069), keyed by a process-unique thread number.
pub(crate) fn per_thread_arena_key() -> ArenaKey {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: ArenaKey = ArenaKey::per_thread(NEXT.fetch_add(1, Ordering::Relaxed));
    }
    KEY.with(|k| *k)
}
