//! The streams' layer of the per-backend state: each thread's current streams and the arena key
//! the pool's hot path reads, and the process's record of owned streams, callback panics and what
//! queued work keeps alive.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Weak;
use std::thread::LocalKey;

use crate::hal::DeviceId;
use crate::pool::{ArenaCache, ArenaKey};
use crate::runtime::state::{default_arena_key, StateRuntime};

use super::inflight::InFlight;
use super::{Inner, Stream};

/// The streams' layer of [`Runtime`](crate::Runtime). Implemented by
/// [`runtime_statics!`](crate::runtime_statics); name `Runtime` in your own bounds.
pub trait StreamRuntime: StateRuntime {
    /// This thread's stream state for this backend.
    #[doc(hidden)]
    fn stream_thread() -> &'static LocalKey<StreamThread<Self>>;
    /// The process's stream state for this backend.
    #[doc(hidden)]
    fn stream_globals() -> &'static StreamGlobals<Self>;
}

/// One thread's stream state for backend `B`. Created by
/// [`runtime_statics!`](crate::runtime_statics); its contents are private to the typed layer.
pub struct StreamThread<B: StreamRuntime> {
    /// The current stream of each device; `None` is the default stream.
    pub(crate) streams: RefCell<Vec<Option<Stream<B>>>>,
    /// The arena key of the current device's current stream: what the pool's hot path reads
    /// ([`ArenaKey::UNSET`] until first read).
    pub(crate) arena_key: Cell<ArenaKey>,
    /// The pool's per-thread cache of arenas.
    pub(crate) arenas: ArenaCache,
    /// Captures gpumem began on this thread's per-thread default stream and has not ended:
    /// their device and stream identity. They are ended when the thread exits (see `Drop`).
    pub(crate) per_thread_captures: RefCell<Vec<(DeviceId, ArenaKey)>>,
}

impl<B: StreamRuntime> Drop for StreamThread<B> {
    /// Ends what this thread's per-thread default stream still captures, discarding the graph:
    /// the stream goes with the thread, and CUDA's driver (580.159) crashes when other threads'
    /// legacy-stream work meets a per-thread stream torn down while it captures.
    fn drop(&mut self) {
        for (device, identity) in self.per_thread_captures.get_mut().drain(..) {
            super::end_abandoned_capture::<B>(device, identity);
        }
    }
}

impl<B: StreamRuntime> StreamThread<B> {
    /// A fresh thread's state: every device on its default stream. A `const fn`, so the
    /// thread-local needs no lazy initialisation on the hot path.
    #[must_use]
    pub const fn new() -> Self {
        StreamThread {
            streams: RefCell::new(Vec::new()),
            arena_key: Cell::new(ArenaKey::UNSET),
            arenas: ArenaCache::new(),
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
        if dev == crate::runtime::state::current_device::<B>() {
            self.refresh_arena_key();
        }
        old
    }

    /// Recomputes the cached arena key after the device or its stream changed.
    pub(crate) fn refresh_arena_key(&self) {
        let key = match self.stream_of(crate::runtime::state::current_device::<B>()) {
            Some(s) => s.arena_key(),
            None => default_arena_key(),
        };
        self.arena_key.set(key);
    }
}

impl<B: StreamRuntime> Default for StreamThread<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// The process's stream state for backend `B`. Created by
/// [`runtime_statics!`](crate::runtime_statics).
pub struct StreamGlobals<B: StreamRuntime> {
    /// Panics caught in callbacks, by stream raw value, until that stream's next `synchronize`.
    pub(crate) panics: parking_lot::Mutex<Vec<(ArenaKey, String)>>,
    /// What queued work and captures keep alive (see `stream::inflight`).
    pub(crate) inflight: InFlight<B>,
    /// The live streams gpumem owns, by arena key (see `stream::owned_stream`).
    pub(crate) owned_streams: parking_lot::Mutex<HashMap<ArenaKey, Weak<Inner<B>>>>,
}

impl<B: StreamRuntime> StreamGlobals<B> {
    /// Empty state; everything is created on first use.
    #[must_use]
    pub fn new() -> Self {
        StreamGlobals {
            panics: parking_lot::Mutex::new(Vec::new()),
            inflight: InFlight::new(),
            owned_streams: parking_lot::Mutex::new(HashMap::new()),
        }
    }
}

impl<B: StreamRuntime> Default for StreamGlobals<B> {
    fn default() -> Self {
        Self::new()
    }
}
