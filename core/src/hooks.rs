//! Memory hooks: user callbacks around the pool's allocations, CuPy's `MemoryHook`.
//!
//! Hooks are registered per thread, keyed by name, and called in registration order for both
//! the pre and the post callbacks (post callbacks are not reversed, as in CuPy). Only the pools
//! call them. A hook is installed with [`install`], which returns a guard: dropping the guard
//! removes the hook, so the guard's scope is where the hook is active (CuPy's `with hook:`).
//!
//! | callback | when | event fields |
//! |---|---|---|
//! | `alloc_preprocess` | before each raw allocation (cache miss; up to three with retries) | `device_id`, `mem_size` |
//! | `alloc_postprocess` | after it, also when it failed (`mem_ptr` 0) | + `mem_ptr` |
//! | `malloc_preprocess` | at the start of a pool `malloc` | `device_id`, `size`, `mem_size` |
//! | `malloc_postprocess` | at its end, also on failure (`mem_ptr`, `pmem_id` 0) | + `mem_ptr`, `pmem_id` |
//! | `free_preprocess` | before a chunk goes back to the pool | `device_id`, `mem_size`, `mem_ptr`, `pmem_id` |
//! | `free_postprocess` | after it went back | the same |
//!
//! A hook returns `Err` to stop an operation. Unlike CuPy (spec §2.4), an error never leaks a
//! chunk or skews the pool's counters: a failing `malloc_postprocess` returns the chunk (firing
//! the free hooks), a failing `alloc_postprocess` frees the new block, and a failing
//! `free_preprocess` still returns the chunk; the error then reaches the caller of `malloc` or
//! [`PooledMemory::free`](crate::PooledMemory::free).
//!
//! While no thread has a hook installed, the pool pays one relaxed atomic load per operation.
//! With hooks on the thread, each step of an operation reads which callbacks the thread's hooks
//! implement ([`MemoryHook::callbacks`], one thread-local load); only when one does, it reads the
//! thread's list of hooks (another thread-local load; no reference count is taken, the list is
//! kept alive while a dispatch runs) and calls them.
//!
//! # Process-wide observers
//!
//! A [`ProcessObserver`] sees the outcome of every operation of every thread (the post
//! callbacks' events, and each raw block given back), with the arena (stream) it was made on;
//! it cannot stop an operation. It is what a recorder of the whole process needs, where a
//! per-thread hook sees only its own thread. Installing one sets a bit of the same atomic that
//! counts hooked threads, so the check on the hot path stays one relaxed load.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{BoxedError, Error, HookError, Result};
use crate::hal::{DeviceId, DevicePtr};

/// What the alloc hooks receive (the arguments CuPy passes them). `mem_ptr` is 0 in `alloc_preprocess` and after
/// a failed allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocEvent {
    /// The pool's device.
    pub device_id: DeviceId,
    /// The rounded size of the raw allocation.
    pub mem_size: usize,
    /// The raw allocation's address.
    pub mem_ptr: DevicePtr,
}

/// What the malloc hooks receive. `mem_ptr` and `pmem_id` are 0 in `malloc_preprocess` and after
/// a failed allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MallocEvent {
    /// The pool's device.
    pub device_id: DeviceId,
    /// The size asked for.
    pub size: usize,
    /// The rounded size.
    pub mem_size: usize,
    /// The address lent.
    pub mem_ptr: DevicePtr,
    /// The id of the lent chunk; the matching free reports the same id.
    pub pmem_id: u64,
}

/// What the free hooks receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeEvent {
    /// The chunk's device.
    pub device_id: DeviceId,
    /// The chunk's (rounded) size.
    pub mem_size: usize,
    /// The chunk's address.
    pub mem_ptr: DevicePtr,
    /// The chunk's id, as reported by `malloc_postprocess`.
    pub pmem_id: u64,
}

/// The result of a hook callback.
pub type HookResult = std::result::Result<(), HookError>;

/// A set of [`MemoryHook`] callbacks: what [`MemoryHook::callbacks`] says a hook implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Callbacks(u8);

impl Callbacks {
    /// `alloc_preprocess`.
    pub const ALLOC_PREPROCESS: Self = Callbacks(1);
    /// `alloc_postprocess`.
    pub const ALLOC_POSTPROCESS: Self = Callbacks(1 << 1);
    /// `malloc_preprocess`.
    pub const MALLOC_PREPROCESS: Self = Callbacks(1 << 2);
    /// `malloc_postprocess`.
    pub const MALLOC_POSTPROCESS: Self = Callbacks(1 << 3);
    /// `free_preprocess`.
    pub const FREE_PREPROCESS: Self = Callbacks(1 << 4);
    /// `free_postprocess`.
    pub const FREE_POSTPROCESS: Self = Callbacks(1 << 5);
    /// None of them.
    pub const NONE: Self = Callbacks(0);
    /// The three `*_preprocess` callbacks.
    pub const PREPROCESS: Self = Callbacks(1 | 1 << 2 | 1 << 4);
    /// The three `*_postprocess` callbacks.
    pub const POSTPROCESS: Self = Callbacks(1 << 1 | 1 << 3 | 1 << 5);
    /// All six.
    pub const ALL: Self = Callbacks(0b11_1111);

    /// Both sets.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Callbacks(self.0 | other.0)
    }

    /// Whether every callback of `other` is in `self`.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Callbacks {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        self.union(other)
    }
}

/// One of the six callbacks, as the pool fires it: its bit and its name (for [`Error::Hook`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Phase(Callbacks, &'static str);

pub(crate) const ALLOC_PREPROCESS: Phase = Phase(Callbacks::ALLOC_PREPROCESS, "alloc_preprocess");
pub(crate) const ALLOC_POSTPROCESS: Phase = Phase(Callbacks::ALLOC_POSTPROCESS, "alloc_postprocess");
pub(crate) const MALLOC_PREPROCESS: Phase = Phase(Callbacks::MALLOC_PREPROCESS, "malloc_preprocess");
pub(crate) const MALLOC_POSTPROCESS: Phase = Phase(Callbacks::MALLOC_POSTPROCESS, "malloc_postprocess");
pub(crate) const FREE_PREPROCESS: Phase = Phase(Callbacks::FREE_PREPROCESS, "free_preprocess");
pub(crate) const FREE_POSTPROCESS: Phase = Phase(Callbacks::FREE_POSTPROCESS, "free_postprocess");

/// A memory hook (CuPy's `MemoryHook`). Every callback has a do-nothing default.
///
/// Hooks are per thread, so they need not be `Send` or `Sync`; they take `&self` and keep any
/// state in `Cell`/`RefCell`.
pub trait MemoryHook {
    /// The name the hook is registered under; two hooks of one name cannot be installed on one
    /// thread at once.
    fn name(&self) -> &str;

    /// The callbacks this hook implements: the pool calls only these, and skips the others
    /// without a call (while no installed hook of the thread has a callback, that step of an
    /// operation costs one thread-local read). All six by default; a hook that leaves some to
    /// their do-nothing defaults can name the rest, as [`Callbacks::POSTPROCESS`] for a hook
    /// that only records outcomes. Read once, when the hook is installed.
    fn callbacks(&self) -> Callbacks {
        Callbacks::ALL
    }

    /// Before a raw allocation.
    ///
    /// # Errors
    ///
    /// An error stops the allocation.
    fn alloc_preprocess(&self, _event: &AllocEvent) -> HookResult {
        Ok(())
    }
    /// After a raw allocation, also a failed one.
    ///
    /// # Errors
    ///
    /// An error frees the new block and fails the allocation.
    fn alloc_postprocess(&self, _event: &AllocEvent) -> HookResult {
        Ok(())
    }
    /// At the start of a pool allocation.
    ///
    /// # Errors
    ///
    /// An error stops the allocation before anything happens.
    fn malloc_preprocess(&self, _event: &MallocEvent) -> HookResult {
        Ok(())
    }
    /// At the end of a pool allocation, also a failed one.
    ///
    /// # Errors
    ///
    /// An error returns the chunk to the pool and fails the allocation.
    fn malloc_postprocess(&self, _event: &MallocEvent) -> HookResult {
        Ok(())
    }
    /// Before a chunk goes back to the pool.
    ///
    /// # Errors
    ///
    /// The chunk goes back anyway; the error reaches `PooledMemory::free`'s caller.
    fn free_preprocess(&self, _event: &FreeEvent) -> HookResult {
        Ok(())
    }
    /// After a chunk went back to the pool.
    ///
    /// # Errors
    ///
    /// The error reaches `PooledMemory::free`'s caller.
    fn free_postprocess(&self, _event: &FreeEvent) -> HookResult {
        Ok(())
    }
}

/// Threads with at least one hook installed. Zero lets the pool skip the thread-local check.
static HOOKED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// The bit of `HOOKED_THREADS` set while a process-wide observer is installed.
const OBSERVED: usize = 1 << (usize::BITS - 1);

/// The calling thread's hooks. The list is shared (`Rc`) and replaced, never changed in place, when
/// a hook is installed or removed. A dispatch calls the hooks of the list it found when it began
/// (read through [`LIST`], with no reference count taken), while a callback that installs or
/// removes a hook changes the list the next operation sees: a list replaced while a dispatch is
/// running on the thread is kept in `retired` until the outermost dispatch ends.
struct Registry {
    hooks: RefCell<Option<Rc<[Entry]>>>,
    /// Lists replaced while a dispatch was running, dropped when the outermost one ends.
    retired: RefCell<Vec<Rc<[Entry]>>>,
}

/// An installed hook and the callbacks it implements (read once, at install).
#[derive(Clone)]
struct Entry {
    hook: Rc<dyn MemoryHook>,
    wanted: u8,
}

thread_local! {
    /// The union of the callbacks of the calling thread's hooks (0: no hook). It has no
    /// destructor, so reading it is a plain thread-local load, valid to the thread's end.
    static WANTED: Cell<u8> = const { Cell::new(0) };
    /// The registry's current list as a dispatch reads it (address and length; empty when no
    /// hook is installed). Like `WANTED` it has no destructor, so a dispatch reads it with a
    /// plain load, where the registry itself (which has one) costs a check of its state and a
    /// `RefCell` borrow. The registry keeps what it points to alive (see [`Registry`]).
    static LIST: Cell<(*const Entry, usize)> = const { Cell::new((std::ptr::null(), 0)) };
    /// How many dispatches are running on the thread (a callback may allocate, and so dispatch
    /// again), and whether a list was retired while one was.
    static DISPATCH: Cell<(u32, bool)> = const { Cell::new((0, false)) };
}

impl Registry {
    fn list(&self) -> Vec<Entry> {
        self.hooks.borrow().as_deref().map(<[_]>::to_vec).unwrap_or_default()
    }

    /// Replaces the list (`None` when it is empty), counting the thread in or out of
    /// `HOOKED_THREADS` when it gains its first hook or loses its last.
    fn set(&self, list: Vec<Entry>) {
        // A hook with no callback still counts as installed (`active` is true), as before.
        let wanted = list.iter().fold(0u8, |m, e| m | e.wanted | INSTALLED);
        let new = if list.is_empty() { None } else { Some(Rc::<[_]>::from(list)) };
        WANTED.with(|w| w.set(wanted));
        LIST.with(|l| l.set(new.as_deref().map_or((std::ptr::null(), 0), |n| (n.as_ptr(), n.len()))));
        let mut hooks = self.hooks.borrow_mut();
        match (hooks.is_some(), new.is_some()) {
            (false, true) => {
                HOOKED_THREADS.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                HOOKED_THREADS.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        let old = std::mem::replace(&mut *hooks, new);
        drop(hooks);
        let Some(old) = old else { return };
        let (depth, _) = DISPATCH.with(Cell::get);
        if depth > 0 {
            // A dispatch of this thread is iterating `old`: it lives until that dispatch ends.
            self.retired.borrow_mut().push(old);
            DISPATCH.with(|d| d.set((depth, true)));
        } else {
            // Dropped after the borrow ends: dropping a hook may run its `Drop`, which may
            // install or remove hooks.
            drop(old);
        }
    }
}

/// The bit of `WANTED` set while the thread has any hook.
const INSTALLED: u8 = 1 << 7;

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = WANTED.try_with(|w| w.set(0));
        // Dispatches after this (from other thread-locals' destructors) find no hook.
        let _ = LIST.try_with(|l| l.set((std::ptr::null(), 0)));
        if self.hooks.get_mut().is_some() {
            HOOKED_THREADS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static HOOKS: Registry =
        const { Registry { hooks: RefCell::new(None), retired: RefCell::new(Vec::new()) } };
}

/// A running dispatch: counted in `DISPATCH` from its start until this is dropped (at its end or
/// while a panicking hook unwinds it); the outermost one drops the lists retired meanwhile.
struct Dispatching;

impl Dispatching {
    #[inline(always)]
    fn begin() -> Self {
        DISPATCH.with(|d| {
            let (depth, retired) = d.get();
            d.set((depth + 1, retired));
        });
        Dispatching
    }
}

impl Drop for Dispatching {
    #[inline(always)]
    fn drop(&mut self) {
        let (depth, retired) = DISPATCH.with(Cell::get);
        DISPATCH.with(|d| d.set((depth - 1, retired)));
        if depth == 1 && retired {
            drop_retired();
        }
    }
}

/// Drops the lists retired while dispatches ran, once none runs. Their hooks' `Drop` may install
/// or remove hooks, or allocate: the registry is not borrowed while they run.
#[cold]
#[inline(never)]
fn drop_retired() {
    DISPATCH.with(|d| d.set((0, false)));
    let retired = HOOKS.try_with(|h| std::mem::take(&mut *h.retired.borrow_mut())).unwrap_or_default();
    drop(retired);
}

/// Whether the calling thread has a hook installed: the check the pool makes on every operation.
#[inline]
#[must_use]
pub fn active() -> bool {
    let state = HOOKED_THREADS.load(Ordering::Relaxed);
    state != 0 && (state & OBSERVED != 0 || WANTED.try_with(Cell::get).unwrap_or(0) != 0)
}

/// A hook's error on its way out of the pool, boxed: a dispatch returns one word, so that the
/// pool's hooked paths move an [`Error`] (many words) only when a hook failed.
pub(crate) type Failed = BoxedError;

/// Whether any hook of the calling thread implements `phase` (one thread-local load).
#[inline]
pub(crate) fn wants(phase: Phase) -> bool {
    WANTED.try_with(Cell::get).unwrap_or(0) & phase.0 .0 != 0
}

/// Calls `call` on every hook of the calling thread in registration order; stops at the first
/// error. Hooks may install or remove hooks, or allocate, from inside a callback: the registry is
/// not borrowed while a hook runs, and this call goes on with the hooks installed when it began.
/// Inlined by force, with [`fire_hooks`]: a call of its own for each event cost the hooked hit 10
/// instructions per pair in its prologues.
#[inline(always)]
pub(crate) fn fire(phase: Phase, call: impl Fn(&dyn MemoryHook) -> HookResult) -> Result<(), Failed> {
    if !wants(phase) {
        return Ok(());
    }
    fire_hooks(phase, call)
}

/// [`fire`] past the check: the list read with one thread-local load, the dispatch counted.
#[inline(always)]
#[allow(unsafe_code)] // the list is read through `LIST`'s pointer; see the SAFETY comment
pub(crate) fn fire_hooks(phase: Phase, call: impl Fn(&dyn MemoryHook) -> HookResult) -> Result<(), Failed> {
    let (ptr, len) = LIST.with(Cell::get);
    if len == 0 {
        return Ok(());
    }
    let _running = Dispatching::begin();
    // SAFETY: `LIST` holds the address and length of the registry's current list, an
    // `Rc<[Entry]>` the registry owns (it is cleared before the registry is dropped). While
    // `_running` counts this dispatch, a list the registry replaces is retired, not dropped,
    // until the outermost dispatch ends, so the slice stays alive and unchanged (an `Rc<[_]>` is
    // never changed in place) for the whole loop.
    let list = unsafe { std::slice::from_raw_parts(ptr, len) };
    for e in list {
        if e.wanted & phase.0 .0 == 0 {
            continue;
        }
        if let Err(source) = call(&*e.hook) {
            return Err(hook_error(&*e.hook, phase.1, source));
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn hook_error(hook: &dyn MemoryHook, phase: &'static str, source: HookError) -> Failed {
    Error::Hook { hook: hook.name().to_owned(), phase, source: source.into() }.into()
}

/// Installs `hook` on the calling thread until the returned guard is dropped.
///
/// # Errors
///
/// [`Error::HookAlreadyRegistered`] when a hook of the same name is installed on this thread
/// (CuPy's `KeyError('memory hook ... already exists')`).
///
/// ```
/// use std::cell::Cell;
/// use gpumem_core::host::Host;
/// use gpumem_core::{MallocEvent, MemoryHook, MemoryPool, hooks, HookResult};
///
/// #[derive(Default)]
/// struct Counter(Cell<usize>);
/// impl MemoryHook for Counter {
///     fn name(&self) -> &str { "Counter" }
///     fn malloc_postprocess(&self, _: &MallocEvent) -> HookResult {
///         self.0.set(self.0.get() + 1);
///         Ok(())
///     }
/// }
///
/// let pool = MemoryPool::<Host>::new();
/// let counter = hooks::install(Counter::default())?;
/// drop(pool.malloc(10)?);
/// drop(pool.malloc(10)?);
/// assert_eq!(counter.0.get(), 2);
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub fn install<H: MemoryHook + 'static>(hook: H) -> Result<HookGuard<H>> {
    let hook = Rc::new(hook);
    HOOKS.with(|h| {
        let mut list = h.list();
        if list.iter().any(|e| e.hook.name() == hook.name()) {
            return Err(Error::HookAlreadyRegistered(hook.name().to_owned()));
        }
        let erased: Rc<dyn MemoryHook> = hook.clone();
        list.push(Entry { hook: erased, wanted: hook.callbacks().0 });
        h.set(list);
        Ok(HookGuard { hook })
    })
}

/// The names of the hooks installed on the calling thread, in call order.
#[must_use]
pub fn installed() -> Vec<String> {
    HOOKS.with(|h| h.list().iter().map(|e| e.hook.name().to_owned()).collect())
}

/// Keeps a hook installed; dropping it removes the hook (whatever the order of removal). It
/// dereferences to the hook, so its state can be read while it is installed.
#[must_use = "the hook is removed as soon as the guard is dropped"]
pub struct HookGuard<H: MemoryHook + 'static> {
    hook: Rc<H>,
}

impl<H: MemoryHook + 'static> HookGuard<H> {
    /// Removes the hook and gives it back (to read what it recorded, or take its writer).
    ///
    /// # Panics
    ///
    /// Never: the registry drops its reference before the hook is unwrapped, and the guard holds
    /// the only other one.
    #[must_use]
    pub fn into_inner(self) -> H {
        let hook = Rc::clone(&self.hook);
        drop(self);
        Rc::try_unwrap(hook).ok().expect("the guard held the last reference to the hook")
    }
}

impl<H: MemoryHook + 'static> Deref for HookGuard<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hook
    }
}

impl<H: MemoryHook + 'static> Drop for HookGuard<H> {
    fn drop(&mut self) {
        let target = Rc::as_ptr(&self.hook).cast::<()>();
        let _ = HOOKS.try_with(|h| {
            let mut list = h.list();
            let before = list.len();
            list.retain(|e| Rc::as_ptr(&e.hook).cast::<()>() != target);
            if list.len() != before {
                h.set(list);
            }
        });
    }
}

impl<H: MemoryHook + fmt::Debug + 'static> fmt::Debug for HookGuard<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HookGuard").field(&self.hook).finish()
    }
}

thread_local! {
    /// The first error a free hook returned while a chunk was dropped (a `Drop` cannot return
    /// it), until [`take_drop_error`] reports it.
    static DROP_ERROR: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Keeps a free hook's error met while a chunk was dropped on this thread.
pub(crate) fn record_drop_error(error: Error) {
    let _ = DROP_ERROR.try_with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(error);
        }
    });
}

/// The first error a free hook returned on this thread while a chunk was being dropped, since the
/// last call; dropping cannot return it, [`PooledMemory::free`](crate::PooledMemory::free) does.
#[must_use]
pub fn take_drop_error() -> Option<Error> {
    DROP_ERROR.try_with(|slot| slot.borrow_mut().take()).ok().flatten()
}

/// What a [`ProcessObserver`] sees: one operation's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// A raw allocation (`mem_ptr` 0 when it failed), as `alloc_postprocess` sees it.
    Alloc(AllocEvent),
    /// A pool allocation (`mem_ptr` and `pmem_id` 0 when it failed), as `malloc_postprocess`.
    Malloc(MallocEvent),
    /// A chunk given back to the pool, as `free_postprocess`.
    Free(FreeEvent),
    /// A raw block given back to the raw allocator (no CuPy hook has it).
    RawFree(AllocEvent),
    /// An iteration boundary of the loop that uses the device's pool (`Pool::step`; no CuPy
    /// hook has it): a recording marks it so that a replay can plan as the pool did.
    Step {
        /// The pool's device.
        device_id: DeviceId,
    },
}

/// One observed operation and the arena it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The operation.
    pub event: Observed,
    /// The arena's key as a number (`ArenaKey::raw`): a stream's raw handle, or the per-thread
    /// flag (the top bit) and a thread's number.
    pub arena: u64,
}

/// Sees every operation of every thread's pools, after it happened. Called on the thread that
/// made the operation, outside the pool's locks; it must not allocate from a pool (it would see
/// its own allocation, and recurse).
pub trait ProcessObserver: Send + Sync + 'static {
    /// One operation.
    fn observe(&self, observation: &Observation);
}

static OBSERVERS: parking_lot::RwLock<Vec<std::sync::Arc<dyn ProcessObserver>>> =
    parking_lot::RwLock::new(Vec::new());

/// Installs a process-wide observer until the guard is dropped.
pub fn install_process_observer(observer: std::sync::Arc<dyn ProcessObserver>) -> ProcessObserverGuard {
    let mut list = OBSERVERS.write();
    list.push(std::sync::Arc::clone(&observer));
    HOOKED_THREADS.fetch_or(OBSERVED, Ordering::Relaxed);
    ProcessObserverGuard { observer }
}

/// Removes its observer when dropped.
#[must_use = "the observer is removed as soon as the guard is dropped"]
pub struct ProcessObserverGuard {
    observer: std::sync::Arc<dyn ProcessObserver>,
}

impl Drop for ProcessObserverGuard {
    fn drop(&mut self) {
        let mut list = OBSERVERS.write();
        let target = std::sync::Arc::as_ptr(&self.observer).cast::<()>();
        if let Some(i) = list.iter().position(|o| std::sync::Arc::as_ptr(o).cast::<()>() == target) {
            list.remove(i);
        }
        if list.is_empty() {
            HOOKED_THREADS.fetch_and(!OBSERVED, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for ProcessObserverGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProcessObserverGuard")
    }
}

/// Whether a process-wide observer is installed.
#[inline]
#[must_use]
pub fn observed() -> bool {
    HOOKED_THREADS.load(Ordering::Relaxed) & OBSERVED != 0
}

/// Tells every process-wide observer of `event` in arena `arena`.
#[inline]
pub(crate) fn observe(event: Observed, arena: u64) {
    if observed() {
        observe_all(event, arena);
    }
}

/// [`observe`] of the event and arena `observation` makes, made only when an observer is
/// installed: the hooked paths otherwise build the event (a copy of the hooks' event) and name
/// the arena's stream before the check, for nothing.
#[inline(always)]
pub(crate) fn observe_with(observation: impl FnOnce() -> (Observed, u64)) {
    if observed() {
        let (event, arena) = observation();
        observe_all(event, arena);
    }
}

#[cold]
#[inline(never)]
fn observe_all(event: Observed, arena: u64) {
    let list: Vec<std::sync::Arc<dyn ProcessObserver>> = OBSERVERS.read().clone();
    let observation = Observation { event, arena };
    for o in list {
        o.observe(&observation);
    }
}
