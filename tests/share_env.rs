//! `GPUMEM_SHARE_ACROSS_STREAMS` makes each new pool lend free memory across streams. A test
//! binary of its own: the environment is process-wide, so nothing else may run beside it.

use gpumem::{MemoryPool, SingleDeviceMemoryPool};

#[test]
#[cfg_attr(
    any(feature = "cuda", feature = "hip"),
    ignore = "needs a GPU: run with --include-ignored on a machine that has one"
)]
fn the_environment_variable_makes_each_new_pool_share_memory_across_streams() {
    assert!(!SingleDeviceMemoryPool::new(0).unwrap().pool().shares_across_streams(), "off by default");
    std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", "1");
    assert!(SingleDeviceMemoryPool::new(0).unwrap().pool().shares_across_streams());
    assert!(MemoryPool::new().device_pool(0).unwrap().pool().shares_across_streams());

    std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", "0");
    assert!(!SingleDeviceMemoryPool::new(0).unwrap().pool().shares_across_streams());
    // Every flag takes the same forms, in any case; empty is unset.
    std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", "ON");
    assert!(SingleDeviceMemoryPool::new(0).unwrap().pool().shares_across_streams());
    std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", " ");
    assert!(!SingleDeviceMemoryPool::new(0).unwrap().pool().shares_across_streams());
    // EV08: a value that is not UTF-8 is refused, not taken as unset.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", std::ffi::OsStr::from_bytes(b"1\xff"));
        let err = SingleDeviceMemoryPool::new(0).unwrap_err();
        assert!(matches!(err, gpumem::Error::InvalidEnvironment { .. }), "{err:?}");
    }

    std::env::set_var("GPUMEM_SHARE_ACROSS_STREAMS", "maybe");
    let err = SingleDeviceMemoryPool::new(0).unwrap_err();
    assert!(matches!(err, gpumem::Error::InvalidEnvironment { .. }), "{err:?}");
    assert!(err.to_string().contains("GPUMEM_SHARE_ACROSS_STREAMS=\"maybe\""), "{err}");
    std::env::remove_var("GPUMEM_SHARE_ACROSS_STREAMS");
}
