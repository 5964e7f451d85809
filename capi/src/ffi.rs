//! The boundary itself: the thread-local error message and the wrapper every entry point runs in.
//!
//! Each entry point clears the calling thread's message, runs its body under `catch_unwind`, and
//! on an error or a panic stores a message and returns the entry point's failure value. No panic
//! crosses into C: unwinding out of an `extern "C"` function would abort the caller's process.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::registry::FAILED;

thread_local! {
    /// The message of the last failed call on this thread; `None` after a successful one.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Why an entry point failed; the message `gpumem_last_error` returns.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

impl From<gpumem::Error> for Failure {
    fn from(e: gpumem::Error) -> Self {
        Failure(e.to_string())
    }
}

/// `Err(Failure)` built from a format string.
macro_rules! fail {
    ($($arg:tt)*) => {
        Err($crate::ffi::Failure(format!($($arg)*)))
    };
}
pub(crate) use fail;

/// Runs `body` as the entry point `name`: clears this thread's message, catches panics, and on
/// failure records `"<name>: <message>"`, counts the failure and returns `failed`.
pub(crate) fn call<T>(name: &str, failed: T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    set_message(None);
    let message = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(Failure(message))) => message,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            format!("internal error (caught panic): {what}")
        }
    };
    FAILED.count(name);
    set_message(Some(format!("{name}: {message}")));
    failed
}

fn set_message(message: Option<String>) {
    // An interior NUL cannot end up in C's string: it is replaced, not truncated at.
    let message = message.map(|m| CString::new(m.replace('\0', "\\0")).unwrap_or_default());
    // At thread exit the slot may be gone; there is then nobody left to read the message.
    let _ = LAST_ERROR.try_with(|slot| {
        // Only write when there is something to change: a successful call on a clean thread
        // touches nothing but the flag check.
        let mut slot = slot.borrow_mut();
        if slot.is_some() || message.is_some() {
            *slot = message;
        }
    });
}

/// This thread's message as a C string, or null; valid until this thread's next gpumem call.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ref().map_or(ptr::null(), |m| m.as_ptr()))
        .unwrap_or(ptr::null())
}
