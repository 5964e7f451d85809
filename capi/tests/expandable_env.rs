//! `GPUMEM_EXPANDABLE_SEGMENTS=1` gives the ABI's pools growing blocks: a second allocation grows
//! the first block in place, counted as one more raw allocation, and the bytes written across the
//! growth read back. A test binary of its own: the variable is read when a device's pool is made,
//! once per process.

use std::ffi::CStr;

use gpumem::{MemoryPointer, UnownedMemory};
use gpumem_capi::*;

mod common;
use common::stats;

#[test]
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
fn the_variable_gives_the_abi_growing_blocks() {
    std::env::set_var("GPUMEM_EXPANDABLE_SEGMENTS", "1");
    // CuPy's rule: a first block of the request's size, so the second request grows it.
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { gpumem_set_growth_policy(0, c"cache_until_out_of_memory".as_ptr()) }, 0);
    // SAFETY: the null stream.
    let a = unsafe { gpumem_torch_malloc(3 << 20, 0, std::ptr::null_mut()) };
    // SAFETY: as above.
    let b = unsafe { gpumem_torch_malloc(5 << 20, 0, std::ptr::null_mut()) };
    assert!(!a.is_null() && !b.is_null(), "{:?}", {
        let p = gpumem_last_error();
        // SAFETY: a non-null result is a NUL-terminated string valid until the next call.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    });
    assert_eq!(b as usize, a as usize + (3 << 20), "the block grew in place");
    let s = stats(0);
    assert_eq!(s.n_raw_allocs, 2, "the block and one growth");
    assert_eq!(s.n_raw_frees, 0);
    // SAFETY: `b` is a chunk of 5 MiB the ABI lent and still holds.
    let view = MemoryPointer::from_memory(
        unsafe { UnownedMemory::new(b as usize, 5 << 20, None, Some(0)) }.unwrap(),
    );
    let data: Vec<u8> = (0..5usize << 20).map(|i| (i % 253) as u8).collect();
    view.copy_from_host(&data, data.len()).unwrap();
    let mut back = vec![0u8; data.len()];
    view.copy_to_host(&mut back, data.len()).unwrap();
    assert!(back == data);
    // SAFETY: both were lent on the null stream by the calls above and are freed once.
    unsafe {
        gpumem_torch_free(a, 3 << 20, 0, std::ptr::null_mut());
        gpumem_torch_free(b, 5 << 20, 0, std::ptr::null_mut());
    }
    std::env::remove_var("GPUMEM_EXPANDABLE_SEGMENTS");
}
