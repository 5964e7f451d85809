//! `GPUMEM_EXPANDABLE_SEGMENTS` gives each new pool growing blocks. A test binary of its own: the
//! environment is process-wide, so nothing else may run beside it.

use gpumem::{MemoryPool, SingleDeviceMemoryPool};

#[test]
#[cfg_attr(
    any(feature = "cuda", feature = "hip"),
    ignore = "needs a GPU: run with --include-ignored on a machine that has one"
)]
fn the_environment_variable_gives_each_new_pool_expandable_segments() {
    std::env::set_var("GPUMEM_EXPANDABLE_SEGMENTS", "1");
    let pool = SingleDeviceMemoryPool::new(0).unwrap();
    assert!(pool.pool().expandable_segments());
    // A second allocation grows the first block in place: its chunk starts where the first ends.
    let a = pool.malloc(3 << 20).unwrap();
    let b = pool.malloc(5 << 20).unwrap();
    assert_eq!(b.ptr(), a.ptr() + (3 << 20));
    assert_eq!(pool.stats().all.segments.allocated, 1, "one block, grown");
    // The multi-device pool makes each device's pool the same way.
    let multi = MemoryPool::new();
    assert!(multi.device_pool(0).unwrap().pool().expandable_segments());

    std::env::set_var("GPUMEM_EXPANDABLE_SEGMENTS", "0");
    assert!(!SingleDeviceMemoryPool::new(0).unwrap().pool().expandable_segments());
    std::env::remove_var("GPUMEM_EXPANDABLE_SEGMENTS");
    assert!(!SingleDeviceMemoryPool::new(0).unwrap().pool().expandable_segments());

    std::env::set_var("GPUMEM_EXPANDABLE_SEGMENTS", "maybe");
    let err = SingleDeviceMemoryPool::new(0).unwrap_err();
    assert!(matches!(err, gpumem::Error::InvalidEnvironment { .. }), "{err:?}");
    let err = MemoryPool::new().device_pool(0).unwrap_err();
    assert!(err.to_string().contains("GPUMEM_EXPANDABLE_SEGMENTS=\"maybe\""), "{err}");
    std::env::remove_var("GPUMEM_EXPANDABLE_SEGMENTS");
}
