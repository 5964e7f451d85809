//! The trampolines that carry Rust closures through the runtimes' C callbacks.
//!
//! Nothing may unwind across the FFI boundary or kill a runtime thread, so every closure runs
//! inside `catch_unwind`; a caught panic's message is kept per backend and per stream, and the
//! stream's next `synchronize` reports it as [`Error::CallbackPanicked`](crate::Error::CallbackPanicked).

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::Mutex;

use crate::pool::ArenaKey;
use crate::runtime::stream::StreamRuntime;

use crate::runtime::state::CallbackMark;

/// Runs `f` marked as inside a callback.
fn as_callback<T>(f: impl FnOnce() -> T) -> T {
    let _mark = CallbackMark::enter();
    f()
}

/// A host function and what it needs to report a panic.
pub(crate) struct HostFnData {
    func: Mutex<Box<dyn FnMut() + Send>>,
    /// Where a panic goes: the backend's record, under this stream's identity.
    report: fn(ArenaKey, String),
    stream: ArenaKey,
}

impl HostFnData {
    pub(crate) fn new<B: StreamRuntime>(stream: ArenaKey, func: Box<dyn FnMut() + Send>) -> Self {
        HostFnData { func: Mutex::new(func), report: record_panic::<B>, stream }
    }

    fn run(&self) {
        as_callback(|| {
            let outcome = catch_unwind(AssertUnwindSafe(|| (self.func.lock())()));
            if let Err(payload) = outcome {
                (self.report)(self.stream, panic_message_and_drop(payload));
            }
        });
    }
}

/// Runs a host function launched outside capture, once, and frees it.
///
/// # Safety
///
/// `data` came from `Box::into_raw(Box<HostFnData>)` and is passed here exactly once.
pub(crate) unsafe extern "C" fn once_trampoline(data: *mut c_void) {
    // SAFETY: guaranteed by the caller (the runtime calls a non-captured host function once).
    let data = unsafe { Box::from_raw(data.cast::<HostFnData>()) };
    data.run();
}

/// Runs a captured host function; the graph that owns it keeps it alive across launches.
///
/// # Safety
///
/// `data` points to a live `HostFnData` owned by an `Arc` that outlives the call.
pub(crate) unsafe extern "C" fn shared_trampoline(data: *mut c_void) {
    // SAFETY: guaranteed by the caller (the graph holds the `Arc` while it can run).
    let data = unsafe { &*data.cast::<HostFnData>() };
    data.run();
}

/// Runs `f` as a callback, catching a panic and recording it for `stream` of backend `B`.
pub(crate) fn catch<B: StreamRuntime>(stream: ArenaKey, f: impl FnOnce()) {
    as_callback(|| {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
            record_panic::<B>(stream, panic_message_and_drop(payload));
        }
    });
}

fn record_panic<B: StreamRuntime>(stream: ArenaKey, message: String) {
    B::stream_globals().panics.lock().push((stream, message));
}

/// The panic's message; the payload is dropped here (see [`drop_payload`]), so nothing unwinds
/// into the runtime.
fn panic_message_and_drop(payload: Box<dyn std::any::Any + Send>) -> String {
    let message = panic_message(payload.as_ref());
    drop_payload(payload);
    message
}

/// How many payloads in a row may panic while dropped before the last is leaked.
const PAYLOAD_DROPS: usize = 8;

/// Drops a panic payload, catching a panic of its `Drop`; that panic's own payload (usually a
/// string) is dropped the same way. Only a chain of [`PAYLOAD_DROPS`] payloads that each panic
/// when dropped has its last one leaked: the chain has to end, and forgetting cannot unwind.
fn drop_payload(mut payload: Box<dyn std::any::Any + Send>) {
    for _ in 0..PAYLOAD_DROPS {
        match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            Ok(()) => return,
            Err(next) => payload = next,
        }
    }
    std::mem::forget(payload);
}

/// Takes the oldest panic recorded for `stream`, if any.
pub(crate) fn take_panic<B: StreamRuntime>(stream: ArenaKey) -> Option<String> {
    let mut panics = B::stream_globals().panics.lock();
    let i = panics.iter().position(|(s, _)| *s == stream)?;
    Some(panics.remove(i).1)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Counts its drops; panics with `then` as the payload while `then` is not `None`.
    struct Payload {
        drops: Arc<AtomicUsize>,
        then: Option<Box<Payload>>,
    }

    impl Drop for Payload {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
            if let Some(next) = self.then.take() {
                std::panic::panic_any(*next);
            }
        }
    }

    fn chain(drops: &Arc<AtomicUsize>, links: usize) -> Payload {
        (1..links).fold(Payload { drops: Arc::clone(drops), then: None }, |inner, _| Payload {
            drops: Arc::clone(drops),
            then: Some(Box::new(inner)),
        })
    }

    #[test]
    fn a_payload_whose_drop_panics_has_that_panics_payload_dropped_too() {
        // Two payloads: the outer one's drop panics with the inner one, which is dropped and not
        // leaked.
        let drops = Arc::new(AtomicUsize::new(0));
        drop_payload(Box::new(chain(&drops, 2)));
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert_eq!(Arc::strong_count(&drops), 1, "no payload was leaked");

        // A chain as long as the bound is dropped whole. (A longer one leaks its rest, which
        // LeakSanitizer would rightly report of this test, so it is not run here.)
        let drops = Arc::new(AtomicUsize::new(0));
        drop_payload(Box::new(chain(&drops, PAYLOAD_DROPS)));
        assert_eq!(drops.load(Ordering::SeqCst), PAYLOAD_DROPS);
        assert_eq!(Arc::strong_count(&drops), 1, "no payload was leaked");
    }
}
