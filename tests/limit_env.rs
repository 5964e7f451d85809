//! `GPUMEM_GPU_MEMORY_LIMIT` sets each new pool's limit. A test binary of its own: the
//! environment is process-wide, so nothing else may run beside it.

#[test]
#[cfg_attr(
    any(feature = "cuda", feature = "hip"),
    ignore = "needs a GPU: run with --include-ignored on a machine that has one"
)]
fn the_environment_variable_sets_each_new_pools_limit() {
    set_limit_env(Some("1024"));
    let pool = gpumem::SingleDeviceMemoryPool::new(0).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 1024);
    pool.set_limit(gpumem::Limit::Bytes(0)).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 0, "set_limit overrides the variable");

    set_limit_env(Some("25%"));
    let total = gpumem::Device::new(0).mem_info().unwrap().total;
    assert_eq!(gpumem::SingleDeviceMemoryPool::new(0).unwrap().get_limit().unwrap(), total / 4);

    // Byte sizes with units; empty is unset.
    set_limit_env(Some("1GiB"));
    assert_eq!(gpumem::SingleDeviceMemoryPool::new(0).unwrap().get_limit().unwrap(), 1 << 30);
    set_limit_env(Some("1.5GB"));
    assert_eq!(gpumem::SingleDeviceMemoryPool::new(0).unwrap().get_limit().unwrap(), 1_500_000_000);
    set_limit_env(Some(""));
    assert_eq!(gpumem::SingleDeviceMemoryPool::new(0).unwrap().get_limit().unwrap(), 0);

    // EV05: a malformed value is InvalidEnvironment naming the variable, the value and the forms.
    set_limit_env(Some("a lot"));
    let err = gpumem::MemoryPool::new().malloc(1).unwrap_err();
    match &err {
        gpumem::Error::InvalidEnvironment { variable, value, expected } => {
            assert_eq!((*variable, value.as_str()), (gpumem::LIMIT_ENV, "a lot"));
            assert!(expected.contains("1GiB") && expected.contains('%'), "{expected}");
        }
        other => panic!("{other:?}"),
    }
    // ... and does not block the `set_limit` that overrides it.
    let pool = gpumem::SingleDeviceMemoryPool::new(0).unwrap();
    assert!(pool.malloc(1).is_err() && pool.get_limit().is_err());
    pool.set_limit(gpumem::Limit::Bytes(1 << 20)).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 1 << 20);
    drop(pool.malloc(1024).unwrap());
    let multi = gpumem::MemoryPool::new();
    multi.set_limit(gpumem::Limit::Bytes(0)).unwrap();
    drop(multi.malloc(1024).unwrap());

    // EV04: a value that is not UTF-8 is refused, not taken as no limit.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: as in `set_limit_env`.
        unsafe { std::env::set_var(gpumem::LIMIT_ENV, std::ffi::OsStr::from_bytes(b"1GiB\xff")) };
        let err = gpumem::SingleDeviceMemoryPool::new(0).unwrap().malloc(1).unwrap_err();
        assert!(matches!(err, gpumem::Error::InvalidEnvironment { .. }), "{err:?}");
    }
    set_limit_env(None);
}

fn set_limit_env(value: Option<&str>) {
    // SAFETY: this binary runs one test, on one thread; nothing reads the environment meanwhile.
    unsafe {
        match value {
            Some(v) => std::env::set_var(gpumem::LIMIT_ENV, v),
            None => std::env::remove_var(gpumem::LIMIT_ENV),
        }
    }
}
