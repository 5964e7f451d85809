//! What the ABI's test binaries share.

use gpumem_capi::{gpumem_get_stats, GpumemStats};

/// `device`'s statistics, through the ABI.
pub fn stats(device: i32) -> GpumemStats {
    let mut s = GpumemStats::default();
    // SAFETY: `s` is a valid out-pointer.
    assert_eq!(unsafe { gpumem_get_stats(device, &mut s) }, 0);
    s
}
