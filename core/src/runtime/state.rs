//! The typed layer's lowest state, per backend: the current device, the device count, the
//! callback flag, and the errors and drops that `Drop` implementations leave for later.
//!
//! `thread_local!` and `static` items cannot be generic, so each backend declares its own with
//! [`runtime_statics!`](crate::runtime_statics), and the typed layer reaches them through a trait
//! per layer: [`StateRuntime`] here, `StreamRuntime` in `stream` for the streams' state (the
//! current streams, what queued work keeps alive), `AllocatorRuntime` in `allocator` for the
//! current allocators and default pools, and [`Runtime`](crate::Runtime) over them all. Each layer names only its own state and what lies below, so the layers
//! import downwards only. Two backends in one process never share a current stream or a pool.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::LocalKey;

use crate::error::{Error, Result};
use crate::hal::{Backend, DeviceId};
use crate::pool::ArenaKey;

/// A marker that keeps a guard on the thread that made it (`!Send`, `!Sync`).
pub(crate) type ThreadBound<B> = PhantomData<(*const (), fn() -> B)>;

/// The lowest layer of [`Runtime`](crate::Runtime): a [`Backend`] with the typed layer's current
/// device and deferred errors. Implemented by [`runtime_statics!`](crate::runtime_statics); name
/// `Runtime` in your own bounds.
pub trait StateRuntime: Backend {
    /// This thread's state for this backend.
    #[doc(hidden)]
    fn thread_state() -> &'static LocalKey<ThreadState>;
    /// The process's state for this backend.
    #[doc(hidden)]
    fn globals() -> &'static Globals;
}

/// One thread's lowest state for a backend. Created by
/// [`runtime_statics!`](crate::runtime_statics); its contents are private to the typed layer.
pub struct ThreadState {
    /// gpumem's current device for this thread.
    pub(crate) device: Cell<DeviceId>,
}

impl ThreadState {
    /// A fresh thread's state: device 0. A `const fn`, so the thread-local needs no lazy
    /// initialisation.
    #[must_use]
    pub const fn new() -> Self {
        ThreadState { device: Cell::new(0) }
    }
}

impl Default for ThreadState {
    fn default() -> Self {
        Self::new()
    }
}

/// A drop or free to run later, elsewhere.
pub(crate) type Deferred = Box<dyn FnOnce() + Send>;

/// The process's lowest state for a backend. Created by
/// [`runtime_statics!`](crate::runtime_statics).
pub struct Globals {
    /// Number of devices, read once.
    pub(crate) device_count: OnceLock<usize>,
    /// Drops that a callback could not do (freeing memory, destroying a handle, waiting),
    /// done at the next `synchronize` or asynchronous operation on a user thread.
    pub(crate) deferred_drops: parking_lot::Mutex<Vec<Deferred>>,
    pub(crate) any_deferred_drops: AtomicBool,
    /// The thread that frees pinned memory (see `free_in_background`); `None` if it could not
    /// start.
    pub(crate) reaper: OnceLock<Option<parking_lot::Mutex<std::sync::mpsc::Sender<Deferred>>>>,
    /// The first error a `Drop` met (a failed free or destroy) since it was last reported: the
    /// next `synchronize` of a stream or device, or [`take_deferred_error`], reports it.
    pub(crate) deferred: parking_lot::Mutex<Option<Error>>,
    /// Whether `deferred` holds an error (read without the lock on every `synchronize`).
    pub(crate) any_deferred: AtomicBool,
}

impl Globals {
    /// Empty state; everything is created on first use.
    #[must_use]
    pub const fn new() -> Self {
        Globals {
            device_count: OnceLock::new(),
            deferred_drops: parking_lot::Mutex::new(Vec::new()),
            any_deferred_drops: AtomicBool::new(false),
            reaper: OnceLock::new(),
            deferred: parking_lot::Mutex::new(None),
            any_deferred: AtomicBool::new(false),
        }
    }
}

impl Default for Globals {
    fn default() -> Self {
        Self::new()
    }
}

/// The calling thread's current device.
pub(crate) fn current_device<B: StateRuntime>() -> DeviceId {
    B::thread_state().try_with(|ts| ts.device.get()).unwrap_or(0)
}

/// The number of devices, asked of the runtime once per process once it answers.
pub(crate) fn device_count<B: StateRuntime>() -> Result<usize> {
    let globals = B::globals();
    if let Some(n) = globals.device_count.get() {
        return Ok(*n);
    }
    let n = B::device_count()?;
    if n == 0 {
        return Err(Error::NoDevice { backend: B::NAME });
    }
    Ok(*globals.device_count.get_or_init(|| n))
}

thread_local! {
    /// Whether this thread is running a host function or stream callback now.
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is inside a host function or stream callback, where the runtimes
/// refuse API calls: what would free memory, destroy a handle or wait is deferred or refused.
pub(crate) fn in_callback() -> bool {
    IN_CALLBACK.try_with(Cell::get).unwrap_or(0) > 0
}

/// Marks the calling thread as inside a callback until dropped.
pub(crate) struct CallbackMark(());

impl CallbackMark {
    pub(crate) fn enter() -> Self {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get() + 1));
        CallbackMark(())
    }
}

impl Drop for CallbackMark {
    fn drop(&mut self) {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get().saturating_sub(1)));
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
pub(crate) fn per_thread_default_stream_checked() -> Result<bool> {
    static PTDS: OnceLock<Result<bool>> = OnceLock::new();
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
pub(crate) fn record_drop_error<B: StateRuntime>(error: Error) {
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
pub fn take_deferred_error<B: StateRuntime>() -> Option<Error> {
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
pub(crate) fn drop_outside_callbacks<B: StateRuntime>(drop: impl FnOnce() + Send + 'static) {
    if in_callback() {
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
pub(crate) fn free_in_background<B: StateRuntime>(free: Deferred) {
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
pub(crate) fn run_deferred<B: StateRuntime>() {
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
pub(crate) fn check_deferred<B: StateRuntime>() -> Result<()> {
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
