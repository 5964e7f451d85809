//! The stream-ordered allocator behind the typed API: `malloc_async`, `MemoryAsync` and
//! `MemoryAsyncPool` (CuPy's `TestMallocAsync` and `TestMemoryAsyncPool`), and when its frees
//! happen.

/// The `async_pool` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __async_pool_tests {
    ($flavor:ident) => {
        mod async_pool {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::mpsc;

            use gpumem::{Error, Limit, MemoryAsync, MemoryAsyncPool, Stream};

            use $crate::read;

            fn supported() -> bool {
                <gpumem::DefaultBackend as $crate::__private::core::Api>::CAPS.stream_ordered_allocation
            }

            /// Asserts that `pool` comes to use `expected` bytes, running `step` before each look
            /// for up to five seconds: another test's thread may be the one that releases a
            /// finished operation's keep, and so queues the free.
            fn comes_to_use(pool: &MemoryAsyncPool, expected: usize, mut step: impl FnMut()) {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                loop {
                    step();
                    let used = pool.used_bytes().unwrap();
                    if used == expected || std::time::Instant::now() > deadline {
                        assert_eq!(used, expected);
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }

            /// One attempt of `async_free_waits_for_queued_work_of_another_stream`: `false` when the
            /// host function holding stream b was let go by its time bound, not by the test, before
            /// the test looked (and `last` is not set).
            fn free_waits_for_another_stream(last: bool) -> bool {
                use std::sync::atomic::{AtomicBool, Ordering};
                use std::sync::Arc;

                let pool = MemoryAsyncPool::new().unwrap();
                let a = Stream::non_blocking().unwrap();
                let b = Stream::non_blocking().unwrap();
                let p = {
                    let _g = a.enter().unwrap();
                    pool.malloc(1 << 20).unwrap()
                };
                a.synchronize().unwrap();
                let used_with_p = pool.used_bytes().unwrap();

                // A memset of p queued behind the held host function keeps p's memory.
                let (go, wait) = mpsc::channel::<()>();
                let wait = std::sync::Mutex::new(wait);
                let timed_out = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&timed_out);
                b.launch_host_func(move || {
                    let released = wait.lock().map(|w| w.recv_timeout(std::time::Duration::from_secs(10)));
                    if !matches!(released, Ok(Ok(()))) {
                        flag.store(true, Ordering::SeqCst);
                    }
                })
                .unwrap();
                p.memset_async(7, 1 << 20, Some(&b)).unwrap();
                drop(p);
                a.synchronize().unwrap();
                let used = pool.used_bytes().unwrap();
                if used != used_with_p && timed_out.load(Ordering::SeqCst) && !last {
                    b.synchronize().unwrap();
                    return false;
                }
                assert_eq!(used, used_with_p, "no free is queued while work of another stream still uses the memory");

                let _ = go.send(());
                b.synchronize().unwrap(); // the memset is done: the free goes to stream a
                comes_to_use(&pool, used_with_p - (1 << 20), || a.synchronize().unwrap());
                true
            }

            conformance! {
                fn malloc_async_gives_a_memory_pointer_on_the_current_stream() {
                    let _serial = $crate::async_pool_lock();
                    if !supported() {
                        assert!(matches!(gpumem::malloc_async(1024), Err(Error::Unsupported { .. })));
                        assert!(matches!(MemoryAsyncPool::new(), Err(Error::Unsupported { .. })));
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    let _g = s.enter().unwrap();
                    let p = gpumem::malloc_async(1000).unwrap();
                    assert_eq!(p.size(), 1000, "malloc_async does not round");
                    assert_ne!(p.ptr(), 0);
                    assert_eq!(p.mem().identity(), "MemoryAsync");
                    assert_eq!(p.device_id(), gpumem::Device::current().id());
                    p.memset_async(0x5a, 1000, None).unwrap();
                    s.synchronize().unwrap();
                    assert!(read(&p, 1000).iter().all(|&b| b == 0x5a));
                    // Out of range is refused as for every other pointer.
                    assert!(matches!((&p + 999).memset(0, 2), Err(Error::OutOfBounds { .. })));
                    let zero = gpumem::malloc_async(0).unwrap();
                    assert_eq!((zero.ptr(), zero.size()), (0, 0), "size 0 allocates nothing");

                    let m = MemoryAsync::new(512, Some(&s)).unwrap();
                    assert_eq!(m.stream(), &s);
                    // The frees run on `s`: done before the next test reads the statistics.
                    drop((p, zero, m));
                    s.synchronize().unwrap();
                }

                fn memory_async_pool_statistics_limit_and_trim() {
                    let _serial = $crate::async_pool_lock();
                    if !supported() {
                        return;
                    }
                    let pool = MemoryAsyncPool::new().unwrap();
                    let s = Stream::non_blocking().unwrap();
                    let _g = s.enter().unwrap();
                    s.synchronize().unwrap();
                    let used_before = pool.used_bytes().unwrap();
                    assert_eq!(pool.get_limit().unwrap(), 0, "no limit: spelled 0, as the other pools");

                    let p = pool.malloc(1000).unwrap();
                    assert_eq!(p.size(), 1024, "MemoryAsyncPool rounds to 512");
                    assert!(pool.used_bytes().unwrap() >= used_before + 1024);
                    assert!(pool.total_bytes().unwrap() >= pool.used_bytes().unwrap());
                    assert_eq!(
                        pool.free_bytes().unwrap(),
                        pool.total_bytes().unwrap() - pool.used_bytes().unwrap()
                    );
                    assert!(matches!(pool.n_free_blocks(), Err(Error::Unsupported { .. })));

                    // A request larger than what the pool holds free, with the limit at what it
                    // holds, is refused before the runtime is asked.
                    let total = pool.total_bytes().unwrap();
                    let free = pool.free_bytes().unwrap();
                    pool.set_limit(Limit::Bytes(total.max(512))).unwrap();
                    assert_eq!(pool.get_limit().unwrap(), total.max(512));
                    let err = pool.malloc(free + 1024).unwrap_err();
                    assert!(matches!(err, Error::LimitExceeded { .. }), "{err:?}");
                    assert!(err.to_string().starts_with("Out of memory allocating"), "{err}");
                    assert!(matches!(pool.set_limit(Limit::Fraction(1.5)), Err(Error::InvalidArgument(_))));
                    pool.set_limit(Limit::Fraction(0.0)).unwrap();
                    assert_eq!(pool.get_limit().unwrap(), 0, "fraction 0 means no limit");

                    drop(p);
                    pool.free_all_blocks(Some(&s)).unwrap();
                    assert_eq!(pool.used_bytes().unwrap(), used_before, "the free ran on the stream");
                    assert_eq!(
                        pool.total_bytes().unwrap(),
                        pool.used_bytes().unwrap(),
                        "free_all_blocks trims the pool to what is lent"
                    );
                }

                fn free_all_blocks_frees_what_queued_work_held() {
                    let _serial = $crate::async_pool_lock();
                    if !supported() {
                        return;
                    }
                    let pool = MemoryAsyncPool::new().unwrap();
                    let s = Stream::non_blocking().unwrap();
                    let _g = s.enter().unwrap();
                    s.synchronize().unwrap();
                    let used_before = pool.used_bytes().unwrap();
                    let p = pool.malloc(1 << 20).unwrap();
                    p.memset_async(1, 1 << 20, None).unwrap();
                    drop(p); // the memset may still be queued: the memory is freed after it
                    comes_to_use(&pool, used_before, || pool.free_all_blocks(None).unwrap());
                }

                fn memory_async_pool_is_an_allocator() {
                    let _serial = $crate::async_pool_lock();
                    if !supported() {
                        return;
                    }
                    let pool = std::sync::Arc::new(MemoryAsyncPool::new().unwrap());
                    let _scope = gpumem::using_allocator(Some(pool));
                    let p = gpumem::alloc(100).unwrap();
                    assert_eq!((p.size(), p.mem().identity()), (512, "MemoryAsync"));
                    let b = gpumem::DeviceBuffer::<f32>::from_slice(&[1.0, 2.0, 3.0]).unwrap();
                    assert_eq!(b.to_vec().unwrap(), vec![1.0, 2.0, 3.0]);
                    drop((p, b));
                    Stream::current().synchronize().unwrap();
                }

                fn async_free_waits_for_queued_work_of_another_stream() {
                    let _serial = $crate::async_pool_lock();
                    if !supported() {
                        return;
                    }
                    // Stream b is held by a host function until the test lets it go, for at most
                    // ten seconds: a device-wide wait elsewhere (another test's cuMemFree) must not
                    // wait for it for good. When that bound ran out before the test looked, b's
                    // work has run and the free is due, so the attempt proves nothing and is made
                    // again; a free queued while b still held the memory fails at once.
                    for attempt in 1..=3 {
                        if free_waits_for_another_stream(attempt == 3) {
                            return;
                        }
                    }
                }

                fn async_free_is_held_back_while_its_stream_captures() {
                    let _serial = $crate::async_pool_lock();
                    let _capture = $crate::capture_lock();
                    if !supported() || !super::supports_capture() {
                        return;
                    }
                    let pool = MemoryAsyncPool::new().unwrap();
                    let s = Stream::non_blocking().unwrap();
                    let p = {
                        let _g = s.enter().unwrap();
                        pool.malloc(4096).unwrap()
                    };
                    s.synchronize().unwrap();
                    let used_with_p = pool.used_bytes().unwrap();
                    let pending = $crate::__private::core::runtime::pools::async_pool::n_pending_async_frees();
                    let other = gpumem::alloc(512).unwrap();
                    s.begin_capture(None).unwrap();
                    other.memset_async(1, 512, Some(&s)).unwrap();
                    drop(p); // its free would be captured into the graph: held back
                    let graph = s.end_capture().unwrap();
                    assert_eq!(
                        $crate::__private::core::runtime::pools::async_pool::n_pending_async_frees(),
                        pending + 1
                    );
                    assert_eq!(pool.used_bytes().unwrap(), used_with_p);
                    graph.launch(Some(&s)).unwrap();
                    graph.launch(Some(&s)).unwrap();
                    {
                        let _g = s.enter().unwrap();
                        pool.free_all_blocks(Some(&s)).unwrap();
                    }
                    s.synchronize().unwrap();
                    assert_eq!(
                        $crate::__private::core::runtime::pools::async_pool::n_pending_async_frees(),
                        pending
                    );
                    assert_eq!(pool.used_bytes().unwrap(), used_with_p - 4096);
                }
            }
        }
    };
}
