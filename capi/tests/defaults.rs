//! The ABI's default without any variable set: `GrowthPolicy::Segments` with blocks that grow in
//! place where the backend has virtual memory (the host backend has). A test binary of its own:
//! `GPUMEM_EXPANDABLE_SEGMENTS` is read when a device's pool is made, once per process.

use std::ffi::CStr;

use gpumem_capi::*;

mod common;
use common::stats;

#[test]
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
fn the_default_is_segments_on_one_growing_block() {
    assert!(std::env::var_os("GPUMEM_EXPANDABLE_SEGMENTS").is_none(), "run without the variable");
    // SAFETY: the null stream.
    let a = unsafe { gpumem_torch_malloc(3 << 20, 0, std::ptr::null_mut()) };
    assert!(!a.is_null());
    // SAFETY: a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(gpumem_get_growth_policy(0)) }.to_str().unwrap(), "segments");
    // Larger than any first block: the first block grows in place rather than a second being made.
    // SAFETY: the null stream.
    let b = unsafe { gpumem_torch_malloc(64 << 20, 0, std::ptr::null_mut()) };
    assert!(!b.is_null());
    assert!(b as usize > a as usize && (b as usize) < a as usize + (64 << 20), "one growing block");
    let held = stats(0).total_bytes;
    assert!(((67 << 20)..=(67 << 20) + (64 << 20) / 64 + (20 << 20)).contains(&held), "{held}");
    // SAFETY: both were lent on the null stream by the calls above and are freed once.
    unsafe {
        gpumem_torch_free(a, 3 << 20, 0, std::ptr::null_mut());
        gpumem_torch_free(b, 64 << 20, 0, std::ptr::null_mut());
    }
    assert_eq!(gpumem_free_all_blocks(0), 0);
    assert_eq!(stats(0).total_bytes, 0, "every byte went back");
}
