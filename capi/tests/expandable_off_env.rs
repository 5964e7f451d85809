//! `GPUMEM_EXPANDABLE_SEGMENTS=0` turns the ABI's default growing blocks off: a request larger than
//! the first block gets a block of its own. A test binary of its own: the variable is read when a
//! device's pool is made, once per process.

use gpumem_capi::*;

mod common;
use common::stats;

#[test]
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
fn zero_gives_the_abi_fixed_blocks() {
    std::env::set_var("GPUMEM_EXPANDABLE_SEGMENTS", "0");
    // SAFETY: the null stream.
    let a = unsafe { gpumem_torch_malloc(3 << 20, 0, std::ptr::null_mut()) };
    // SAFETY: as above.
    let b = unsafe { gpumem_torch_malloc(64 << 20, 0, std::ptr::null_mut()) };
    assert!(!a.is_null() && !b.is_null());
    assert_eq!(stats(0).n_raw_allocs, 2, "two fixed blocks, no growth");
    // SAFETY: both were lent on the null stream by the calls above and are freed once.
    unsafe {
        gpumem_torch_free(a, 3 << 20, 0, std::ptr::null_mut());
        gpumem_torch_free(b, 64 << 20, 0, std::ptr::null_mut());
    }
    assert_eq!(gpumem_free_all_blocks(0), 0);
    assert_eq!(stats(0).n_raw_frees, 2);
    std::env::remove_var("GPUMEM_EXPANDABLE_SEGMENTS");
}
