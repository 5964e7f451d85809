//! Out-of-memory observers for C: a function the pool calls before an allocation's
//! out-of-memory error returns (PyTorch's `_attach_out_of_memory_observer`).

use std::ffi::{c_char, c_int, c_void, CString};

use crate::ffi::call;
use crate::pool;

/// An out-of-memory observer: called with the `user_data` it was added with, the device, and
/// the error's message (valid during the call only), on the allocating thread, before the
/// allocation fails. It must not call back into gpumem's allocation functions.
pub type GpumemOomObserver =
    Option<unsafe extern "C" fn(user_data: *mut c_void, device: c_int, message: *const c_char)>;

/// The caller's pointer, handed back to its observer from whichever thread allocates.
struct UserData(*mut c_void);

// SAFETY: gpumem never reads the pointer; `gpumem_add_oom_observer`'s caller promises that its
// observer may be called with it from any thread.
unsafe impl Send for UserData {}
// SAFETY: as for `Send`: only handed back, never dereferenced here.
unsafe impl Sync for UserData {}

/// Adds `observer` to `device`'s pool: before an allocation fails for want of memory (the
/// device's or the limit's), the pool calls `observer(user_data, device, message)`. Observers
/// stay until [`gpumem_clear_oom_observers`].
///
/// Returns 0, or -1 with the last error set (unknown device, null `observer`). Thread-safe.
///
/// # Safety
///
/// `observer` may be called with `user_data` from any thread that allocates, until the
/// observers are cleared, and returns without unwinding.
#[no_mangle]
pub unsafe extern "C" fn gpumem_add_oom_observer(
    device: c_int,
    observer: GpumemOomObserver,
    user_data: *mut c_void,
) -> c_int {
    call("gpumem_add_oom_observer", -1, || {
        let Some(observer) = observer else {
            return crate::ffi::fail!("observer is null");
        };
        let user_data = UserData(user_data);
        pool::device_pool(device)?.add_oom_observer(move |error, snapshot| {
            let message = CString::new(error.to_string().replace('\0', "\\0")).unwrap_or_default();
            let user_data = &user_data;
            // SAFETY: the caller of `gpumem_add_oom_observer` promised the observer may be called
            // with its pointer from this thread; the message lives for the call.
            unsafe { observer(user_data.0, snapshot.device, message.as_ptr()) };
        });
        Ok(0)
    })
}

/// Removes every out-of-memory observer of `device`'s pool.
///
/// Returns 0, or -1 with the last error set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_clear_oom_observers(device: c_int) -> c_int {
    call("gpumem_clear_oom_observers", -1, || {
        pool::device_pool(device)?.clear_oom_observers();
        Ok(0)
    })
}
