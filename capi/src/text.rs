//! How the ABI hands text to C: into the caller's buffer, `snprintf`-style.
//!
//! The caller passes a buffer and its size; the text is copied with as much as fits (always
//! NUL-terminated when the size is not 0), and its full length (without the NUL) is returned, so
//! a caller can ask with a size of 0 first, then allocate `length + 1` bytes and ask again.

use std::ffi::c_char;

use crate::ffi::{fail, Failure};

/// Copies `text` into `buf` (`len` bytes; null only with `len` 0) and returns its full length.
///
/// # Safety
///
/// `buf` is null or valid for writing `len` bytes.
///
/// # Errors
///
/// A null `buf` with a nonzero `len`; a text longer than `isize::MAX` bytes.
pub(crate) unsafe fn write_text(text: &str, buf: *mut c_char, len: usize) -> Result<isize, Failure> {
    let Ok(full) = isize::try_from(text.len()) else {
        return fail!("the text is too long for the ABI");
    };
    if len == 0 {
        return Ok(full);
    }
    if buf.is_null() {
        return fail!("buf is null with a size of {len}");
    }
    let n = text.len().min(len - 1);
    // SAFETY: the caller gives `len` writable bytes at `buf`; `n + 1 <= len`, and the text does
    // not overlap a buffer the caller owns.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    Ok(full)
}
