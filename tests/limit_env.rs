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

    set_limit_env(Some("a lot"));
    let err = gpumem::MemoryPool::new().malloc(1).unwrap_err();
    assert!(err.to_string().contains(gpumem::LIMIT_ENV), "{err}");
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
