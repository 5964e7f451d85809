//! The current allocators: what [`alloc`] uses (CuPy's `cupy.cuda.alloc`, `set_allocator`,
//! `using_allocator`, `get_allocator`) and what [`alloc_pinned_memory`] uses (CuPy's
//! `alloc_pinned_memory`, `set_pinned_memory_allocator`).
//!
//! The process-wide allocator starts as the backend's default memory pool (as `import cupy`
//! sets it). [`set_allocator`] replaces it; [`using_allocator`] overrides it on the calling thread
//! until its guard is dropped, and nests. The pinned allocator starts as the default pinned
//! memory pool (as `import cupy` sets it); [`set_pinned_memory_allocator`] replaces it for the
//! whole process, `None` selecting unpooled pinned memory (CuPy's `_malloc`), and
//! [`reset_pinned_memory_allocator`] goes back to the default pool. gpumem's own pinned staging
//! (the asynchronous copies of [`DeviceBuffer`](crate::DeviceBuffer)) goes through it.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::LocalKey;

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::runtime::memory::Memory;
pub use crate::runtime::pinned::{PinnedMemoryAllocator, PlainPinnedAllocator};
use crate::runtime::pinned::{PinnedMemoryPointer, PinnedMemoryPool};
pub use crate::runtime::pointer::Allocator;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::pools::MemoryPool;
use crate::runtime::state::ThreadBound;
use crate::runtime::stream::StreamRuntime;

/// The allocators' layer of [`Runtime`](crate::Runtime): the current allocators and the default
/// pools. Implemented by [`runtime_statics!`](crate::runtime_statics); name `Runtime` in your own
/// bounds.
pub trait AllocatorRuntime: StreamRuntime {
    /// This thread's allocator state for this backend.
    #[doc(hidden)]
    fn allocator_thread() -> &'static LocalKey<AllocatorThread<Self>>;
    /// The process's allocator state for this backend.
    #[doc(hidden)]
    fn allocator_globals() -> &'static AllocatorGlobals<Self>;
}

/// A thread's copy of the process-wide allocator, with the generation it was read at.
pub(crate) type CachedAllocator<B> = (u64, Arc<dyn Allocator<B>>);

/// One thread's allocator state for backend `B`. Created by
/// [`runtime_statics!`](crate::runtime_statics); its contents are private to the typed layer.
pub struct AllocatorThread<B: AllocatorRuntime> {
    /// The allocators of the `using_allocator` scopes entered on this thread, innermost last.
    pub(crate) allocators: RefCell<Vec<Arc<dyn Allocator<B>>>>,
    /// The process-wide allocator as this thread last read it, with the generation it read
    /// (`AllocatorGlobals::allocator_generation`): `alloc` uses it without the global lock or a
    /// reference count, which threads would otherwise all write to.
    pub(crate) global_allocator: RefCell<Option<CachedAllocator<B>>>,
}

impl<B: AllocatorRuntime> AllocatorThread<B> {
    /// A fresh thread's state: no scope, no copy. A `const fn`, so the thread-local needs no
    /// lazy initialisation on the hot path.
    #[must_use]
    pub const fn new() -> Self {
        AllocatorThread { allocators: RefCell::new(Vec::new()), global_allocator: RefCell::new(None) }
    }
}

impl<B: AllocatorRuntime> Default for AllocatorThread<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// The process's allocator state for backend `B`. Created by
/// [`runtime_statics!`](crate::runtime_statics).
pub struct AllocatorGlobals<B: AllocatorRuntime> {
    /// The allocator `alloc` uses when no `using_allocator` scope is active.
    pub(crate) allocator: RwLock<Option<Arc<dyn Allocator<B>>>>,
    /// Raised by every `set_allocator`, after the allocator is replaced: a thread whose copy of
    /// the allocator is of an older generation reads it again.
    pub(crate) allocator_generation: AtomicU64,
    /// The default device memory pool (`get_default_memory_pool`).
    pub(crate) memory_pool: OnceLock<Arc<MemoryPool<B>>>,
    /// The default pinned memory pool (`get_default_pinned_memory_pool`).
    pub(crate) pinned_pool: OnceLock<Arc<PinnedMemoryPool<B>>>,
    /// The pinned allocator `alloc_pinned_memory` uses; `None`: the default pinned pool.
    pub(crate) pinned_allocator: RwLock<Option<Arc<dyn PinnedMemoryAllocator<B>>>>,
}

impl<B: AllocatorRuntime> AllocatorGlobals<B> {
    /// Empty state; everything is created on first use.
    #[must_use]
    pub fn new() -> Self {
        AllocatorGlobals {
            allocator: RwLock::new(None),
            allocator_generation: AtomicU64::new(0),
            memory_pool: OnceLock::new(),
            pinned_pool: OnceLock::new(),
            pinned_allocator: RwLock::new(None),
        }
    }
}

impl<B: AllocatorRuntime> Default for AllocatorGlobals<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// No pool: every allocation is a runtime allocation, freed when its last pointer goes (CuPy's
/// `_malloc`, what `set_allocator(None)` selects).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainAllocator;

impl<B: AllocatorRuntime> Allocator<B> for PlainAllocator {
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        Ok(MemoryPointer::from_memory(Memory::<B>::new(size)?))
    }
}

/// The backend's default memory pool (CuPy's `get_default_memory_pool()`).
#[must_use]
pub fn get_default_memory_pool<B: AllocatorRuntime>() -> Arc<MemoryPool<B>> {
    Arc::clone(B::allocator_globals().memory_pool.get_or_init(|| Arc::new(MemoryPool::new())))
}

/// The backend's default pinned memory pool (CuPy's `get_default_pinned_memory_pool()`).
#[must_use]
pub fn get_default_pinned_memory_pool<B: AllocatorRuntime>() -> Arc<PinnedMemoryPool<B>> {
    Arc::clone(B::allocator_globals().pinned_pool.get_or_init(|| Arc::new(PinnedMemoryPool::new())))
}

/// The allocator [`alloc`] uses on this thread: the innermost `using_allocator`, else the
/// process-wide one.
#[must_use]
pub fn get_allocator<B: AllocatorRuntime>() -> Arc<dyn Allocator<B>> {
    if let Some(a) = B::allocator_thread().with(|ts| ts.allocators.borrow().last().cloned()) {
        return a;
    }
    global_allocator::<B>()
}

/// Allocates `size` bytes on the current device with the current allocator (CuPy's
/// `cupy.cuda.alloc`).
///
/// Outside `using_allocator` scopes, each thread uses its own copy of the process-wide allocator
/// (read again after every [`set_allocator`]), so threads allocating at once share no lock and no
/// reference count. A thread's copy keeps an allocator that was replaced alive until that thread's
/// next `alloc` (or its exit).
///
/// # Errors
///
/// The allocator's.
#[inline]
pub fn alloc<B: AllocatorRuntime>(size: usize) -> Result<MemoryPointer<B>> {
    let fast = B::allocator_thread().try_with(|ts| {
        if !ts.allocators.try_borrow().is_ok_and(|scopes| scopes.is_empty()) {
            return None;
        }
        let generation = B::allocator_globals().allocator_generation.load(Ordering::Acquire);
        // Borrowed, not cloned, while the allocator runs: an allocator that calls `alloc` again
        // borrows it again; one that makes a refresh necessary meanwhile takes the slow path.
        let cached = ts.global_allocator.try_borrow().ok()?;
        match &*cached {
            Some((g, a)) if *g == generation => Some(a.malloc(size)),
            _ => None,
        }
    });
    match fast {
        Ok(Some(result)) => result,
        _ => alloc_slow::<B>(size),
    }
}

/// `alloc` when this thread's copy of the allocator is missing or stale, or inside a
/// `using_allocator` scope.
#[cold]
fn alloc_slow<B: AllocatorRuntime>(size: usize) -> Result<MemoryPointer<B>> {
    let scoped = B::allocator_thread().try_with(|ts| ts.allocators.borrow().last().cloned()).ok().flatten();
    if let Some(a) = scoped {
        return a.malloc(size);
    }
    // The generation first: a `set_allocator` after it leaves this copy stale, never wrong.
    let generation = B::allocator_globals().allocator_generation.load(Ordering::Acquire);
    let a = global_allocator::<B>();
    let _ = B::allocator_thread().try_with(|ts| {
        if let Ok(mut cached) = ts.global_allocator.try_borrow_mut() {
            *cached = Some((generation, Arc::clone(&a)));
        }
    });
    a.malloc(size)
}

/// The process-wide allocator.
fn global_allocator<B: AllocatorRuntime>() -> Arc<dyn Allocator<B>> {
    if let Some(a) = B::allocator_globals().allocator.read().as_ref() {
        return Arc::clone(a);
    }
    get_default_memory_pool::<B>()
}

/// Sets the process-wide allocator; `None` selects [`PlainAllocator`] (no pool), as CuPy's
/// `set_allocator(None)`.
///
/// # Errors
///
/// [`Error::AllocatorInUse`] while a `using_allocator` guard is alive on this thread, as CuPy.
pub fn set_allocator<B: AllocatorRuntime>(allocator: Option<Arc<dyn Allocator<B>>>) -> Result<()> {
    if B::allocator_thread().with(|ts| !ts.allocators.borrow().is_empty()) {
        return Err(Error::AllocatorInUse);
    }
    let allocator = allocator.unwrap_or_else(|| Arc::new(PlainAllocator));
    let globals = B::allocator_globals();
    let mut current = globals.allocator.write();
    let old = current.replace(allocator);
    globals.allocator_generation.fetch_add(1, Ordering::Release);
    drop(current);
    // This thread's copy goes now; other threads drop theirs at their next `alloc`.
    let _ = B::allocator_thread().try_with(|ts| ts.global_allocator.try_borrow_mut().map(|mut c| c.take()));
    // The replaced allocator is dropped outside the lock (a pool's drop may call the runtime).
    drop(old);
    Ok(())
}

/// Makes `allocator` (`None`: [`PlainAllocator`]) this thread's allocator until the guard is
/// dropped (CuPy's `with using_allocator(a):`). Scopes nest.
#[must_use = "the allocator is restored as soon as the guard is dropped"]
pub fn using_allocator<B: AllocatorRuntime>(allocator: Option<Arc<dyn Allocator<B>>>) -> AllocatorGuard<B> {
    let allocator = allocator.unwrap_or_else(|| Arc::new(PlainAllocator));
    B::allocator_thread().with(|ts| ts.allocators.borrow_mut().push(allocator));
    AllocatorGuard { _not_send: PhantomData }
}

/// Ends a [`using_allocator`] scope when dropped.
pub struct AllocatorGuard<B: AllocatorRuntime> {
    _not_send: ThreadBound<B>,
}

impl<B: AllocatorRuntime> Drop for AllocatorGuard<B> {
    fn drop(&mut self) {
        let _ = B::allocator_thread().try_with(|ts| ts.allocators.borrow_mut().pop());
    }
}

/// Sets the process-wide pinned allocator (CuPy's `set_pinned_memory_allocator`); `None` selects
/// [`PlainPinnedAllocator`] (no pool), as CuPy's `set_pinned_memory_allocator(None)`.
pub fn set_pinned_memory_allocator<B: AllocatorRuntime>(
    allocator: Option<Arc<dyn PinnedMemoryAllocator<B>>>,
) {
    let allocator = allocator.unwrap_or_else(|| Arc::new(PlainPinnedAllocator));
    *B::allocator_globals().pinned_allocator.write() = Some(allocator);
}

/// Makes the default pinned memory pool the pinned allocator again, as it is at start.
pub fn reset_pinned_memory_allocator<B: AllocatorRuntime>() {
    *B::allocator_globals().pinned_allocator.write() = None;
}

/// The pinned allocator [`alloc_pinned_memory`] uses: the one set, else the default pinned
/// memory pool.
#[must_use]
pub fn get_pinned_memory_allocator<B: AllocatorRuntime>() -> Arc<dyn PinnedMemoryAllocator<B>> {
    if let Some(a) = B::allocator_globals().pinned_allocator.read().as_ref() {
        return Arc::clone(a);
    }
    get_default_pinned_memory_pool::<B>()
}

/// Allocates `size` bytes of pinned host memory with the current pinned allocator (CuPy's
/// `alloc_pinned_memory`). What finished transfers kept alive is released first, as CuPy's
/// watcher check.
///
/// # Errors
///
/// The allocator's.
pub fn alloc_pinned_memory<B: AllocatorRuntime>(size: usize) -> Result<PinnedMemoryPointer<B>> {
    crate::runtime::stream::inflight::collect::<B>();
    get_pinned_memory_allocator::<B>().malloc(size)
}
