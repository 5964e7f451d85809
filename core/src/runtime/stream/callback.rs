//! The trampolines that carry Rust closures through the runtimes' C callbacks.
//!
//! Nothing may unwind across the FFI boundary or kill a runtime thread, so every closure runs
//! inside `catch_unwind`; a caught panic's message is kept per backend and per stream, and the
//! stream's next `synchronize` reports it as [`Error::CallbackPanicked`](crate::Error::CallbackPanicked).

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::Mutex;

use crate::runtime::state::Runtime;

/// A host function and what it needs to report a panic.
pub(crate) struct HostFnData {
    func: Mutex<Box<dyn FnMut() + Send>>,
    /// Where a panic goes: the backend's record, under this stream's raw value.
    report: fn(usize, String),
    stream: usize,
}

impl HostFnData {
    pub(crate) fn new<B: Runtime>(stream: usize, func: Box<dyn FnMut() + Send>) -> Self {
        HostFnData { func: Mutex::new(func), report: record_panic::<B>, stream }
    }

    fn run(&self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.func.lock())()));
        if let Err(payload) = outcome {
            (self.report)(self.stream, panic_message(payload.as_ref()));
        }
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

/// Runs `f`, catching a panic and recording it for `stream` of backend `B`.
pub(crate) fn catch<B: Runtime>(stream: usize, f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        record_panic::<B>(stream, panic_message(payload.as_ref()));
    }
}

fn record_panic<B: Runtime>(stream: usize, message: String) {
    B::globals().panics.lock().push((stream, message));
}

/// Takes the oldest panic recorded for `stream`, if any.
pub(crate) fn take_panic<B: Runtime>(stream: usize) -> Option<String> {
    let mut panics = B::globals().panics.lock();
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
