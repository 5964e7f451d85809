//! Streams: owned ([`Stream`]), foreign ([`ExternalStream`]), the null and per-thread default
//! streams, the current stream of each device, callbacks, host functions and capture.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use crate::error::{Error, Result};
use crate::hal::{CaptureMode, CaptureStatus, DeviceId, StreamFlags};
use crate::pool::ArenaKey;
use crate::runtime::state::{current_device, per_thread_arena_key, per_thread_default_stream};

pub(crate) mod callback;
pub mod event;
pub mod graph;
pub(crate) mod inflight;
pub mod state;
#[cfg(test)]
mod tests;

use callback::HostFnData;
pub use event::Event;
pub use graph::Graph;
pub use state::StreamRuntime;

/// Raw value of the null stream.
pub const NULL_STREAM_PTR: usize = 0;
/// Raw value of the legacy default stream (`cudaStreamLegacy`).
pub const LEGACY_STREAM_PTR: usize = 1;
/// Raw value of the per-thread default stream (`cudaStreamPerThread`).
pub const PER_THREAD_STREAM_PTR: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Created by gpumem; destroyed when the last clone is dropped.
    Owned,
    /// A foreign handle; never destroyed by gpumem.
    External,
    /// The null stream or the per-thread default stream; nothing to destroy.
    Default,
}

/// A stream's handle and what owns it, shared by the stream's clones.
pub(crate) struct Inner<B: StreamRuntime> {
    handle: B::Stream,
    device_id: Option<DeviceId>,
    kind: Kind,
    /// Keeps the owner of a foreign handle alive (`Stream::from_external`).
    _owner: Option<Arc<dyn Any + Send + Sync>>,
}

impl<B: StreamRuntime> Drop for Inner<B> {
    fn drop(&mut self) {
        if self.kind != Kind::Default {
            forget_owned::<B>(self);
        }
        if self.kind == Kind::Owned {
            let (dev, handle) = (self.device_id.unwrap_or(0), self.handle);
            crate::runtime::state::drop_outside_callbacks::<B>(move || {
                // SAFETY: the handle is live until the destroy below.
                if let Err(e) = unsafe { finish_unrecorded::<B>(dev, handle) } {
                    crate::runtime::state::record_drop_error::<B>(e);
                }
                // SAFETY: an owned handle came from `B::stream_create` and this is its only
                // destroy: `Inner` is shared through an `Arc` and this runs once, when the last
                // clone goes. The stream is gone either way; an error is kept for the next
                // synchronize.
                if let Err(e) = unsafe { B::stream_destroy(dev, handle) } {
                    crate::runtime::state::record_drop_error::<B>(e);
                }
            });
        }
    }
}

/// Waits for the work queued with no event on the owned stream `handle` of `device`, if there is
/// any, before the stream is destroyed or given up: its arena (keyed by the handle) may then serve
/// a new stream that gets the same handle, whose work nothing orders after this stream's.
///
/// # Safety
///
/// `handle` is a live stream of `device`.
unsafe fn finish_unrecorded<B: StreamRuntime>(device: DeviceId, handle: B::Stream) -> Result<()> {
    let identity = ArenaKey::stream(B::stream_to_raw(handle));
    if inflight::forget_stream::<B>((device, identity)) {
        // SAFETY: the caller's promise.
        unsafe { B::stream_synchronize(device, handle) }?;
    }
    Ok(())
}

/// The live stream gpumem owns whose arena key is `key`: how the pool's stream order finds the
/// stream behind another stream's arena (`pools::share`). `None` for the default streams, foreign
/// streams and streams already destroyed.
pub(crate) fn owned_stream<B: StreamRuntime>(key: ArenaKey) -> Option<Stream<B>> {
    // The lock is released before anything is dropped: dropping a stream's last clone takes it.
    let found = B::stream_globals().owned_streams.lock().get(&key).map(Weak::upgrade);
    match found {
        Some(Some(inner)) if inner.kind == Kind::Owned => Some(Stream { inner }),
        Some(other) => {
            drop(other);
            // Being destroyed, or given up by `into_raw`: no longer gpumem's.
            let mut streams = B::stream_globals().owned_streams.lock();
            if streams.get(&key).is_some_and(|w| w.strong_count() == 0) {
                streams.remove(&key);
            }
            None
        }
        None => None,
    }
}

/// Takes `inner` out of the owned streams, if it is the one listed under its key (a stream
/// created later may have the same handle).
fn forget_owned<B: StreamRuntime>(inner: &Inner<B>) {
    let key = ArenaKey::stream(B::stream_to_raw(inner.handle));
    let mut streams = B::stream_globals().owned_streams.lock();
    if streams.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), inner) || w.strong_count() == 0) {
        streams.remove(&key);
    }
}

/// A stream of work on a device: CuPy's `cupy.cuda.Stream`.
///
/// Cloning a `Stream` is cheap and gives another handle to the same stream; the stream is
/// destroyed when the last clone is dropped (the current-stream slot of a thread holds a clone, so
/// a stream is never destroyed while it is current anywhere, as in CuPy). Work already queued runs
/// to completion after the stream is destroyed, except that dropping the last clone first waits
/// for the stream when gpumem queued work on it that it did not record (work on memory of this
/// stream's own arena, which keeps nothing alive) or still keeps memory for: the stream's arena is
/// keyed by its handle, which a new stream may get. [`into_raw`](Self::into_raw) waits the same
/// way.
///
/// Equality compares the raw handle, as CuPy's `__eq__` compares `ptr`.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use gpumem_core::host::Host;
/// use gpumem_core::{MemoryPool, Stream};
///
/// let pool = MemoryPool::<Host>::new();
/// let s = Stream::<Host>::non_blocking()?;
/// {
///     let _current = s.enter()?; // s is current until `_current` drops
///     let p = pool.malloc(1024)?; // from s's arena
///     p.memset_async(7, 1024, None)?; // on s, the current stream
///     let done = Arc::new(AtomicUsize::new(0));
///     let d = done.clone();
///     s.launch_host_func(move || { d.fetch_add(1, Ordering::SeqCst); })?;
///     s.synchronize()?;
///     assert_eq!(done.load(Ordering::SeqCst), 1);
/// }
/// assert_eq!(Stream::<Host>::current(), Stream::null()); // restored
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct Stream<B: StreamRuntime> {
    inner: Arc<Inner<B>>,
}

impl<B: StreamRuntime> Clone for Stream<B> {
    fn clone(&self) -> Self {
        Stream { inner: Arc::clone(&self.inner) }
    }
}

impl<B: StreamRuntime> PartialEq for Stream<B> {
    fn eq(&self, other: &Self) -> bool {
        self.ptr() == other.ptr()
    }
}

impl<B: StreamRuntime> Eq for Stream<B> {}

impl<B: StreamRuntime> std::hash::Hash for Stream<B> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ptr().hash(state);
    }
}

impl<B: StreamRuntime> fmt::Debug for Stream<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // CuPy's repr: <Stream ptr (device id)>, -1 for "any device".
        write!(f, "<Stream {} (device {})>", self.ptr(), self.device_id().unwrap_or(-1))
    }
}

/// Options for [`Stream::with_options`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// The stream does not synchronise with the legacy default stream.
    pub non_blocking: bool,
    /// The stream's priority; `None` is the default (0). Lower numbers are higher priorities.
    pub priority: Option<i32>,
}

impl<B: StreamRuntime> Stream<B> {
    fn from_parts(
        handle: B::Stream,
        device_id: Option<DeviceId>,
        kind: Kind,
        owner: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        let stream = Stream { inner: Arc::new(Inner { handle, device_id, kind, _owner: owner }) };
        if kind == Kind::Owned {
            B::stream_globals()
                .owned_streams
                .lock()
                .insert(stream.arena_key(), Arc::downgrade(&stream.inner));
        }
        stream
    }

    /// Creates a blocking stream with the default priority on the current device.
    ///
    /// # Errors
    ///
    /// The runtime's error (no device, driver not found, out of resources).
    pub fn new() -> Result<Self> {
        Self::with_options(StreamOptions::default())
    }

    /// Creates a stream that does not synchronise with the legacy default stream.
    ///
    /// # Errors
    ///
    /// As [`Stream::new`].
    pub fn non_blocking() -> Result<Self> {
        Self::with_options(StreamOptions { non_blocking: true, priority: None })
    }

    /// Creates a stream on the current device with the given options.
    ///
    /// gpumem differs from CuPy here: a priority outside the device's range is refused with
    /// [`Error::PriorityOutOfRange`] instead of being clamped silently by the runtime.
    ///
    /// # Errors
    ///
    /// `PriorityOutOfRange`; the runtime's error.
    pub fn with_options(options: StreamOptions) -> Result<Self> {
        let dev = current_device::<B>();
        let priority = options.priority.unwrap_or(0);
        if priority != 0 {
            let (least, greatest) = B::stream_priority_range(dev)?;
            if priority > least || priority < greatest {
                return Err(Error::PriorityOutOfRange { priority, least, greatest });
            }
        }
        let flags = StreamFlags { non_blocking: options.non_blocking };
        let handle = B::stream_create(dev, flags, priority)?;
        Ok(Self::from_parts(handle, Some(dev), Kind::Owned, None))
    }

    /// The null stream (raw value 0, CuPy's `Stream.null`), valid on any device.
    #[must_use]
    pub fn null() -> Self {
        Self::from_parts(B::null_stream(), None, Kind::Default, None)
    }

    /// The per-thread default stream (raw value 2, CuPy's `Stream.ptds`), valid on any device.
    /// Each host thread that uses it gets its own stream and its own pool arena.
    #[must_use]
    pub fn per_thread() -> Self {
        Self::from_parts(B::per_thread_stream(), None, Kind::Default, None)
    }

    /// The legacy default stream (raw value 1), on which the synchronous copies run.
    #[must_use]
    pub fn legacy() -> Self {
        Self::from_parts(B::legacy_stream(), None, Kind::Default, None)
    }

    /// The default stream: the per-thread default stream when `GPUMEM_PER_THREAD_DEFAULT_STREAM=1`
    /// was set at start, the null stream otherwise.
    #[must_use]
    pub fn default_stream() -> Self {
        if per_thread_default_stream() {
            Self::per_thread()
        } else {
            Self::null()
        }
    }

    /// Takes ownership of a raw stream handle: gpumem destroys it when the last clone is dropped.
    ///
    /// # Safety
    ///
    /// `handle` is a live stream created on device `device_id` by this backend's runtime, not
    /// owned by anything else (nothing else destroys it).
    pub unsafe fn from_raw(handle: B::Stream, device_id: DeviceId) -> Self {
        Self::from_parts(handle, Some(device_id), Kind::Owned, None)
    }

    /// Wraps a foreign stream and keeps `owner` alive as long as the returned stream (CuPy's
    /// `Stream.from_external`). gpumem never destroys the handle.
    ///
    /// # Safety
    ///
    /// `handle` is a live stream of this backend's runtime and stays live while `owner` lives.
    pub unsafe fn from_external(
        handle: B::Stream,
        device_id: Option<DeviceId>,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        Self::from_parts(handle, device_id, Kind::External, Some(owner))
    }

    /// Gives up ownership and returns the raw handle; the caller must destroy it (or wrap it again
    /// with [`Stream::from_raw`]). Waits for the stream first when gpumem's work on it needs it
    /// (see the [type's docs](Self)).
    ///
    /// # Errors
    ///
    /// Gives the stream back, untouched, when other clones of it exist or it is not owned by
    /// gpumem.
    pub fn into_raw(self) -> Result<B::Stream, Self> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) if inner.kind == Kind::Owned => {
                // No longer ours to destroy.
                inner.kind = Kind::External;
                // SAFETY: the stream is live (this value owned it until now).
                if let Err(e) = unsafe { finish_unrecorded::<B>(inner.device_id.unwrap_or(0), inner.handle) }
                {
                    crate::runtime::state::record_drop_error::<B>(e);
                }
                Ok(inner.handle)
            }
            Ok(inner) => Err(Stream { inner: Arc::new(inner) }),
            Err(inner) => Err(Stream { inner }),
        }
    }

    /// The raw handle.
    #[must_use]
    pub fn handle(&self) -> B::Stream {
        self.inner.handle
    }

    /// The raw handle's value (CuPy's `ptr`).
    #[must_use]
    pub fn ptr(&self) -> usize {
        B::stream_to_raw(self.inner.handle)
    }

    /// The device the stream was created on; `None` (CuPy's -1) for streams valid on any device.
    #[must_use]
    pub fn device_id(&self) -> Option<DeviceId> {
        self.inner.device_id
    }

    /// Whether gpumem destroys this stream when its last clone goes (false for external streams
    /// and the default streams).
    #[must_use]
    pub fn is_owned(&self) -> bool {
        self.inner.kind == Kind::Owned
    }

    /// The device to run this stream's operations in: its own, or the current one.
    pub(crate) fn run_device(&self) -> DeviceId {
        self.inner.device_id.unwrap_or_else(current_device::<B>)
    }

    /// The stream as the ownership model names it, running in `device`.
    pub(crate) fn target(&self, device: DeviceId) -> inflight::Target<B> {
        inflight::Target {
            handle: self.inner.handle,
            device,
            identity: self.arena_key(),
            lasting: self.lasts(),
        }
    }

    /// Whether the stream outlives the work queued on it and any thread can name it (see
    /// [`inflight::Target::lasting`]): one gpumem owns, or the null or legacy stream.
    fn lasts(&self) -> bool {
        self.is_owned() || matches!(self.ptr(), NULL_STREAM_PTR | LEGACY_STREAM_PTR)
    }

    /// The pool arena this stream allocates from, computed on the calling thread.
    pub(crate) fn arena_key(&self) -> ArenaKey {
        match self.ptr() {
            PER_THREAD_STREAM_PTR => per_thread_arena_key(),
            raw => ArenaKey::stream(raw),
        }
    }

    /// Whether the stream was created non-blocking.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn is_non_blocking(&self) -> Result<bool> {
        // SAFETY: `self` keeps its stream alive (owned: destroyed only when the last clone goes;
        // external: the caller of the unsafe constructor promised; default streams always are).
        Ok(unsafe { B::stream_flags(self.run_device(), self.inner.handle) }?.non_blocking)
    }

    /// The stream's priority.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn priority(&self) -> Result<i32> {
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        unsafe { B::stream_priority(self.run_device(), self.inner.handle) }
    }

    /// Whether all work queued on the stream is done. As in CuPy, a failed query reads as `false`
    /// rather than an error (and, as in CUDA, querying a capturing stream invalidates the
    /// capture); use [`Stream::query`] to see the error.
    #[must_use]
    pub fn done(&self) -> bool {
        self.query().unwrap_or(false)
    }

    /// `Ok(true)` when all work queued on the stream is done.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        unsafe { B::stream_query(self.run_device(), self.inner.handle) }
    }

    /// Waits for all work queued on the stream. A panic caught in a callback or host function of
    /// this stream since the last `synchronize` is reported here.
    ///
    /// # Errors
    ///
    /// The runtime's error (a capturing stream cannot be synchronised), or
    /// [`Error::CallbackPanicked`].
    pub fn synchronize(&self) -> Result<()> {
        if crate::runtime::state::in_callback() {
            return Err(Error::NotAllowedInCallback { operation: "Stream::synchronize" });
        }
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        unsafe { B::stream_synchronize(self.run_device(), self.inner.handle) }?;
        inflight::stream_done::<B>();
        crate::runtime::state::check_deferred::<B>()?;
        match callback::take_panic::<B>(self.arena_key()) {
            Some(message) => Err(Error::CallbackPanicked(message)),
            None => Ok(()),
        }
    }

    /// Records an event at the current end of the stream's work and returns it; with `None`, a
    /// new event with default flags is created (CuPy's `record(event=None)`).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn record(&self, event: Option<&Event<B>>) -> Result<Event<B>> {
        let event = match event {
            Some(e) => e.clone(),
            None => Event::new()?,
        };
        event.record(Some(self))?;
        Ok(event)
    }

    /// Makes future work on this stream wait until `event`'s last recorded work is done.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn wait_event(&self, event: &Event<B>) -> Result<()> {
        let dev = self.run_device();
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        unsafe { B::stream_wait_event(dev, self.inner.handle, event.raw()) }?;
        // SAFETY: as above.
        unsafe { inflight::after_wait(&self.target(dev)) };
        Ok(())
    }

    /// Queues `callback(stream, status)` to run once the work queued so far is done (CuPy's
    /// `add_callback`; CUDA's `cuStreamAddCallback`). The callback runs on a runtime thread; it
    /// must not queue work or synchronise. Prefer [`Stream::launch_host_func`], which also works
    /// under capture.
    ///
    /// The stream handed to the callback is a non-owning view of this stream (equal to it): the
    /// callback cannot destroy the stream it runs on. A panic in the callback is caught and
    /// reported by the next [`Stream::synchronize`].
    ///
    /// # Errors
    ///
    /// The runtime's error (for instance while the stream captures).
    pub fn add_callback<F>(&self, callback: F) -> Result<()>
    where
        F: FnOnce(&Stream<B>, Result<()>) + Send + 'static,
    {
        // The callback gets a clone of this stream, so a clone kept past the callback keeps the
        // stream alive; a last clone dropped inside the callback is destroyed afterwards, on a
        // user thread.
        let stream = self.clone();
        let identity = self.arena_key();
        let wrapped: crate::hal::StreamCallback = Box::new(move |status: Result<()>| {
            callback::catch::<B>(identity, move || callback(&stream, status));
        });
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        unsafe { B::add_callback(self.run_device(), self.inner.handle, wrapped) }
    }

    /// Queues `func` to run on a runtime thread once the work queued so far is done (CUDA's
    /// `cuLaunchHostFunc`). While the stream captures, the function is captured into the graph
    /// and runs on every launch of the graph; the graph keeps it alive.
    ///
    /// `func` must not queue work or synchronise. A panic in it is caught and reported by the
    /// next [`Stream::synchronize`].
    ///
    /// # Errors
    ///
    /// The runtime's error.
    pub fn launch_host_func<F>(&self, func: F) -> Result<()>
    where
        F: FnMut() + Send + 'static,
    {
        let dev = self.run_device();
        let target = self.target(dev);
        let data = HostFnData::new::<B>(target.identity, Box::new(func));
        // Under the capture lock: a concurrent `begin_capture` cannot come between the decision
        // and the launch (a run-once function captured into a graph would be freed by its first
        // replay).
        inflight::with_capture_of::<B, ()>(target, |record, capturing| {
            if capturing {
                let data = Arc::new(data);
                let ptr = Arc::as_ptr(&data).cast_mut().cast::<c_void>();
                // SAFETY: the trampoline borrows `data` without taking ownership; `data` is kept by
                // the capture record, then by its graph, for as long as the graph can run it (or,
                // in a capture gpumem did not begin, for good).
                unsafe { B::launch_host_func(dev, self.inner.handle, callback::shared_trampoline, ptr)? };
                match record {
                    Some(record) => record.host_fns.push(data),
                    None => inflight::keep_forever::<B>(inflight::Keep::Other(data)),
                }
                return Ok(());
            }
            let ptr = Box::into_raw(Box::new(data)).cast::<c_void>();
            // SAFETY: the trampoline takes ownership of the box and runs once.
            let launched =
                unsafe { B::launch_host_func(dev, self.inner.handle, callback::once_trampoline, ptr) };
            if let Err(e) = launched {
                // SAFETY: the runtime refused the launch, so it never saw `ptr`: it is ours again.
                drop(unsafe { Box::from_raw(ptr.cast::<HostFnData>()) });
                return Err(e);
            }
            Ok(())
        })
    }

    /// Makes this stream the current stream of its device (or of the current device, for streams
    /// valid on any device), until another is made current. CuPy's `use()`.
    ///
    /// # Errors
    ///
    /// [`Error::StreamDeviceMismatch`] when the stream belongs to another device than the
    /// current one.
    pub fn use_stream(&self) -> Result<&Self> {
        let dev = self.check_device()?;
        B::stream_thread().with(|ts| ts.replace_stream(dev, Some(self.clone())));
        Ok(self)
    }

    /// Makes this stream current until the returned guard is dropped; the guard then restores
    /// whatever stream was current when it was created. Guards nest.
    ///
    /// gpumem differs from CuPy 14.2 here: CuPy's `with` block restores the top of its stack and
    /// forgets a stream set with `use()` before or inside the block (CuPy issue #8377); gpumem
    /// restores exactly what was current on entry.
    ///
    /// # Errors
    ///
    /// [`Error::StreamDeviceMismatch`], as [`Stream::use_stream`].
    pub fn enter(&self) -> Result<StreamGuard<B>> {
        let dev = self.check_device()?;
        let previous = B::stream_thread().with(|ts| ts.replace_stream(dev, Some(self.clone())));
        Ok(StreamGuard { device: dev, previous, _not_send: PhantomData })
    }

    fn check_device(&self) -> Result<DeviceId> {
        let current = current_device::<B>();
        match self.inner.device_id {
            Some(d) if d != current => {
                Err(Error::StreamDeviceMismatch { stream_device: d, current_device: current })
            }
            _ => Ok(current),
        }
    }

    /// The current stream of `device` (the current device for `None`) on this thread: the one
    /// last made current there, or the default stream.
    #[must_use]
    pub fn current_on(device: Option<DeviceId>) -> Self {
        let dev = device.unwrap_or_else(current_device::<B>);
        B::stream_thread().with(|ts| ts.stream_of(dev)).unwrap_or_else(Self::default_stream)
    }

    /// The current stream of the current device on this thread.
    #[must_use]
    pub fn current() -> Self {
        Self::current_on(None)
    }

    /// Starts capturing the work queued on this stream into a graph (relaxed mode by default,
    /// for the reason CuPy gives: the pool may allocate raw memory during capture).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` on the null and legacy streams ("cannot capture on the default (legacy)
    /// stream", as CuPy); `Unsupported` on a backend without capture; the runtime's error.
    pub fn begin_capture(&self, mode: Option<CaptureMode>) -> Result<()> {
        if matches!(self.ptr(), NULL_STREAM_PTR | LEGACY_STREAM_PTR) {
            return Err(Error::CaptureOnDefaultStream);
        }
        if !B::CAPS.capture {
            return Err(Error::Unsupported { operation: "begin_capture", backend: B::NAME });
        }
        let identity = self.arena_key();
        inflight::begin_capture::<B>(self.run_device(), identity, || {
            // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
            unsafe { B::begin_capture(self.run_device(), self.inner.handle, mode.unwrap_or_default()) }?;
            // The capture's id finds it from streams that join it. A backend that cannot tell
            // (or fails to) leaves their work to be held for good, which is safe.
            // SAFETY: as above.
            Ok(unsafe { B::capture_id(self.run_device(), self.inner.handle) }.ok().flatten())
        })?;
        if self.ptr() == PER_THREAD_STREAM_PTR {
            // Ended when the thread exits, if the program does not end it first.
            let dev = self.run_device();
            let _ =
                B::stream_thread().try_with(|ts| ts.per_thread_captures.borrow_mut().push((dev, identity)));
        }
        Ok(())
    }

    /// Ends the capture and returns the instantiated graph, which owns the host functions
    /// captured on the way.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error (not capturing, capture
    /// invalidated, work of other streams not joined back).
    pub fn end_capture(&self) -> Result<Graph<B>> {
        let dev = self.run_device();
        if !B::CAPS.capture {
            return Err(Error::Unsupported { operation: "end_capture", backend: B::NAME });
        }
        let identity = self.arena_key();
        if self.ptr() == PER_THREAD_STREAM_PTR {
            let _ = B::stream_thread()
                .try_with(|ts| ts.per_thread_captures.borrow_mut().retain(|c| *c != (dev, identity)));
        }
        let (raw, record) = inflight::end_capture::<B, _>(identity, || {
            // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
            unsafe { B::end_capture(dev, self.inner.handle) }
        })?;
        Ok(Graph::new(raw, dev, record))
    }

    /// Whether the stream is capturing.
    ///
    /// # Errors
    ///
    /// [`Error::CaptureInvalidated`] when an error invalidated the capture (CuPy fails too);
    /// `Unsupported` on a backend without capture (the backend is not asked); the runtime's
    /// error, for instance when the null stream is queried while a blocking stream captures.
    pub fn is_capturing(&self) -> Result<bool> {
        if !B::CAPS.capture {
            return Err(Error::Unsupported { operation: "capture_status", backend: B::NAME });
        }
        // SAFETY: `self` keeps its stream alive (see `is_non_blocking`).
        match unsafe { B::capture_status(self.run_device(), self.inner.handle) }? {
            CaptureStatus::None => Ok(false),
            CaptureStatus::Active => Ok(true),
            CaptureStatus::Invalidated => Err(Error::CaptureInvalidated),
        }
    }
}

/// Restores the stream that was current when [`Stream::enter`] made another current. Not `Send`:
/// it must be dropped on the thread that created it.
#[must_use = "the stream stops being current as soon as the guard is dropped"]
pub struct StreamGuard<B: StreamRuntime> {
    device: DeviceId,
    previous: Option<Stream<B>>,
    _not_send: PhantomData<*const ()>,
}

impl<B: StreamRuntime> Drop for StreamGuard<B> {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // `try_with`: at thread exit the state may already be gone, and then there is nothing to
        // restore.
        let _ = B::stream_thread().try_with(|ts| ts.replace_stream(self.device, previous));
    }
}

/// A stream gpumem did not create and never destroys: CuPy's `cupy.cuda.ExternalStream`.
///
/// It dereferences to [`Stream`], so every stream method (`synchronize`, `record`, `wait_event`,
/// `add_callback`, `launch_host_func`, `use_stream`, `enter`, capture) is available on it. The
/// user keeps the handle alive while gpumem uses it.
pub struct ExternalStream<B: StreamRuntime>(Stream<B>);

impl<B: StreamRuntime> ExternalStream<B> {
    /// Wraps a foreign stream handle (CuPy's `ExternalStream(ptr, device_id=-1)`). With `None`
    /// for the device the stream is taken as valid on any device; the caller then makes sure it
    /// is used on the device it was created on.
    ///
    /// # Safety
    ///
    /// `handle` is a live stream of this backend's runtime (created by gpumem, by the vendor
    /// runtime or by another library) and stays live while this value or any clone of its
    /// [`Stream`] is used.
    pub unsafe fn new(handle: B::Stream, device_id: Option<DeviceId>) -> Self {
        ExternalStream(Stream::from_parts(handle, device_id, Kind::External, None))
    }

    /// Wraps a foreign stream by its raw value (CuPy's `ptr`).
    ///
    /// # Safety
    ///
    /// As [`ExternalStream::new`]; `ptr` is 0, 1, 2 or a live stream handle.
    pub unsafe fn from_ptr(ptr: usize, device_id: Option<DeviceId>) -> Self {
        // SAFETY: forwarded to the caller.
        unsafe { Self::new(B::stream_from_raw(ptr), device_id) }
    }

    /// The stream, as a [`Stream`] (still never destroyed by gpumem).
    #[must_use]
    pub fn into_stream(self) -> Stream<B> {
        self.0
    }
}

impl<B: StreamRuntime> std::ops::Deref for ExternalStream<B> {
    type Target = Stream<B>;
    fn deref(&self) -> &Stream<B> {
        &self.0
    }
}

impl<B: StreamRuntime> Clone for ExternalStream<B> {
    fn clone(&self) -> Self {
        ExternalStream(self.0.clone())
    }
}

impl<B: StreamRuntime> fmt::Debug for ExternalStream<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<ExternalStream {} (device {})>", self.ptr(), self.device_id().unwrap_or(-1))
    }
}

impl<B: StreamRuntime> From<ExternalStream<B>> for Stream<B> {
    fn from(s: ExternalStream<B>) -> Self {
        s.0
    }
}

/// Ends a capture gpumem began on the calling thread's per-thread default stream, which the
/// program left capturing, and discards its graph (the thread is exiting).
pub(crate) fn end_abandoned_capture<B: StreamRuntime>(device: DeviceId, identity: ArenaKey) {
    let ended = inflight::end_capture::<B, _>(identity, || {
        // SAFETY: the per-thread handle is valid on the thread it names, the calling one.
        unsafe { B::end_capture(device, B::per_thread_stream()) }
    });
    // An error means the capture was invalidated or unjoined: it is over either way.
    if let Ok((raw, record)) = ended {
        drop(Graph::<B>::new(raw, device, record));
    }
}

/// The stream an operation runs on, as the ownership model names it (see [`inflight::Target`]).
pub(crate) fn target<B: StreamRuntime>(stream: Option<&Stream<B>>) -> inflight::Target<B> {
    if let Some(s) = stream {
        return s.target(s.run_device());
    }
    // The current stream without making a `Stream` (the default one would be a new allocation
    // each time).
    let dev = current_device::<B>();
    let current =
        B::stream_thread().with(|ts| ts.with_stream_of(dev, |s| s.target(s.device_id().unwrap_or(dev))));
    current.unwrap_or_else(|| {
        if per_thread_default_stream() {
            let handle = B::per_thread_stream();
            inflight::Target { handle, device: dev, identity: per_thread_arena_key(), lasting: false }
        } else {
            let handle = B::null_stream();
            let identity = ArenaKey::stream(B::stream_to_raw(handle));
            inflight::Target { handle, device: dev, identity, lasting: true }
        }
    })
}

/// The stream an operation runs on: the one given, or the current one; and the device to run it
/// in. The handle is live for as long as the caller's borrow of `stream` (or, for `None`, until
/// the thread's current stream changes): callers use it within the call that asked.
pub(crate) fn resolve<B: StreamRuntime>(stream: Option<&Stream<B>>) -> (B::Stream, DeviceId, usize) {
    match stream {
        Some(s) => (s.handle(), s.run_device(), s.ptr()),
        None => {
            // The current stream without making a `Stream` (the default one would be a new
            // allocation each time).
            let dev = current_device::<B>();
            let current = B::stream_thread()
                .with(|ts| ts.with_stream_of(dev, |s| (s.handle(), s.device_id().unwrap_or(dev), s.ptr())));
            current.unwrap_or_else(|| {
                let handle =
                    if per_thread_default_stream() { B::per_thread_stream() } else { B::null_stream() };
                (handle, dev, B::stream_to_raw(handle))
            })
        }
    }
}
