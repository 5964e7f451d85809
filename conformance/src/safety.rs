//! Stream safety and sound handles: what queued work, graphs, callbacks and other threads may
//! never do to memory a safe program holds (each test is a scenario that corrupted or freed memory
//! under running work before gpumem kept it alive).

/// The `safety` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __safety_tests {
    ($flavor:ident) => {
        mod safety {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::{mpsc, Arc, Mutex};
            use std::time::{Duration, Instant};

            use gpumem::{Device, Error, Event, Memory, MemoryPointer, MemoryPool, PinnedMemoryPointer, Stream};

            use super::supports_capture;
            use $crate::read;

            const N: usize = 4096;

            /// Queues a host function that keeps `s` busy for `ms` milliseconds.
            fn busy(s: &Stream, ms: u64) {
                s.launch_host_func(move || std::thread::sleep(Duration::from_millis(ms))).unwrap();
            }

            fn own_memory(n: usize) -> MemoryPointer {
                MemoryPointer::from_memory(Memory::new(n).unwrap())
            }

            /// Queues, on `s`, a memset of `a` held back for 100 ms and then a host function that
            /// counts in the returned counter once the memset has run.
            fn held_memset_then_count(s: &Stream, a: &MemoryPointer) -> Arc<AtomicUsize> {
                busy(s, 100);
                a.memset_async(3, N, Some(s)).unwrap();
                let done = Arc::new(AtomicUsize::new(0));
                let d = Arc::clone(&done);
                s.launch_host_func(move || {
                    d.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
                done
            }

            /// Two memsets of one chunk of stream `s1` on two streams, the first held back for
            /// 100 ms on `s1` (`own_first`) or on `s2`: the second runs after it.
            fn later_memset_lands_last(own_first: bool) {
                let pool = MemoryPool::new();
                let s1 = Stream::non_blocking().unwrap();
                let s2 = Stream::non_blocking().unwrap();
                let a = own_stream_chunk(&pool, &s1);
                let (first, second) = if own_first { (&s1, &s2) } else { (&s2, &s1) };
                busy(first, 100);
                a.memset_async(1, N, Some(first)).unwrap();
                a.memset_async(2, N, Some(second)).unwrap();
                second.synchronize().unwrap();
                first.synchronize().unwrap();
                assert!(read(&a, N).iter().all(|&x| x == 2), "the second memset ran before the first");
            }

            /// Synchronous memsets of `p` on another thread against asynchronous ones on `s`:
            /// each is ordered with the other thread's, so the bytes end up all one value.
            fn sync_and_async_memsets_race(p: MemoryPointer, s: &Stream) {
                let rounds = race_rounds();
                let q = p.clone();
                let t = std::thread::spawn(move || {
                    for _ in 0..rounds {
                        q.memset(0x22, N).unwrap();
                    }
                });
                for _ in 0..rounds {
                    p.memset_async(0x33, N, Some(s)).unwrap();
                }
                s.synchronize().unwrap();
                t.join().unwrap();
                assert_one_value(&read(&p, N), &[0x22, 0x33]);
            }

            /// `N` bytes of `pool`, lent on stream `s` (its arena).
            fn own_stream_chunk(pool: &MemoryPool, s: &Stream) -> MemoryPointer {
                let _current = s.enter().unwrap();
                pool.malloc(N).unwrap()
            }

            /// How often each thread of a race scenario touches the bytes: enough for the two
            /// threads to overlap natively, few under Miri (which interleaves them itself).
            fn race_rounds() -> usize {
                if cfg!(miri) { 20 } else { 500 }
            }

            /// Every byte is the same one of `values` (no access tore another).
            fn assert_one_value(bytes: &[u8], values: &[u8]) {
                assert!(values.contains(&bytes[0]), "unexpected byte {:#x}", bytes[0]);
                assert!(bytes.iter().all(|&x| x == bytes[0]), "two accesses interleaved");
            }

            conformance! {
                fn memory_written_on_another_stream_is_not_lent_while_the_write_is_queued() {
                    let pool = MemoryPool::new();
                    let side = Stream::non_blocking().unwrap();
                    let a = pool.malloc(N).unwrap();
                    busy(&side, 200);
                    a.memset_async(0xAA, N, Some(&side)).unwrap();
                    drop(a);
                    let b = pool.malloc(N).unwrap();
                    b.memset(0x11, N).unwrap();
                    side.synchronize().unwrap();
                    assert!(read(&b, N).iter().all(|&x| x == 0x11), "the queued write reached the new owner");
                }

                fn a_synchronous_access_waits_for_queued_work_on_the_same_bytes() {
                    let side = Stream::non_blocking().unwrap();
                    let a = own_memory(N);
                    a.memset(1, N).unwrap();
                    busy(&side, 100);
                    a.memset_async(2, N, Some(&side)).unwrap();
                    // No synchronize: the read waits for the memset queued on `side`.
                    assert!(read(&a, N).iter().all(|&x| x == 2));
                }

                fn another_stream_is_ordered_after_queued_work_on_the_same_bytes() {
                    let s1 = Stream::non_blocking().unwrap();
                    let s2 = Stream::non_blocking().unwrap();
                    let a = own_memory(N);
                    busy(&s1, 100);
                    a.memset_async(1, N, Some(&s1)).unwrap();
                    a.memset_async(2, N, Some(&s2)).unwrap();
                    s2.synchronize().unwrap();
                    s1.synchronize().unwrap();
                    assert!(read(&a, N).iter().all(|&x| x == 2), "s2's memset ran before s1's");
                }

                fn a_graph_keeps_memory_dropped_after_capture() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    let m = own_memory(N);
                    s.begin_capture(None).unwrap();
                    m.memset_async(7, N, Some(&s)).unwrap();
                    let g = s.end_capture().unwrap();
                    drop(m);
                    let other = own_memory(N);
                    other.memset(1, N).unwrap();
                    for _ in 0..3 {
                        g.launch(Some(&s)).unwrap();
                    }
                    s.synchronize().unwrap();
                    assert!(read(&other, N).iter().all(|&x| x == 1));
                }

                fn a_pool_chunk_freed_after_capture_is_not_lent_while_the_graph_lives() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let a = pool.malloc(N).unwrap();
                    s.begin_capture(None).unwrap();
                    a.memset_async(7, N, Some(&s)).unwrap();
                    let g = s.end_capture().unwrap();
                    drop(a);
                    let b = pool.malloc(N).unwrap();
                    b.memset(1, N).unwrap();
                    g.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert!(read(&b, N).iter().all(|&x| x == 1), "the replay wrote the new owner's bytes");
                }

                fn a_capture_lends_its_own_dropped_memory_again_within_itself() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let _current = s.enter().unwrap();
                    s.begin_capture(None).unwrap();
                    let a = pool.malloc(N).unwrap();
                    let first = a.ptr();
                    a.memset_async(1, N, None).unwrap();
                    drop(a);
                    let b = pool.malloc(N).unwrap();
                    assert_eq!(b.ptr(), first, "the capture lends its dropped temporary again");
                    b.memset_async(2, N, None).unwrap();
                    let kept = pool.malloc(N).unwrap();
                    assert_ne!(kept.ptr(), first, "not while it is in use");
                    kept.memset_async(3, N, None).unwrap();
                    drop(b);
                    let graph = s.end_capture().unwrap();
                    drop(_current);
                    assert_eq!(pool.used_bytes(), 2 * N, "two chunks for three allocations");
                    // Outside the capture the graph's memory is not lent.
                    let eager = pool.malloc(N).unwrap();
                    assert_ne!(eager.ptr(), first);
                    eager.memset(9, N).unwrap();
                    graph.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(read(&eager, N), vec![9u8; N]);
                    assert_eq!(read(&kept, N), vec![3u8; N]);
                    drop(graph);
                    drop(kept);
                    assert_eq!(pool.used_bytes(), N, "the graph gave its memory back");
                }

                fn a_planned_pool_keeps_a_graphs_memory_from_its_plan_and_its_pool() {
                    // An iteration's plan serves fixed places; memory a capture was served from the
                    // plan and dropped after it must not be served again, from the plan or the
                    // pool, while the graph lives, and the graph's replays must not reach what is
                    // lent instead.
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let _current = s.enter().unwrap();
                    let device = Device::current().id();
                    let iteration = || {
                        let a = pool.malloc(N).unwrap();
                        let b = pool.malloc(2 * N).unwrap();
                        a.memset_async(1, N, None).unwrap();
                        b.memset_async(2, 2 * N, None).unwrap();
                        (a, b)
                    };
                    for _ in 0..3 {
                        drop(iteration());
                        pool.step(device).unwrap();
                    }
                    let stats = pool.device_pool(device).unwrap().pool().plan_stats();
                    assert_eq!(stats.state, gpumem::core::pool::PlanState::Planned, "{stats:?}");
                    let planned = iteration();
                    let (a_at, b_at) = (planned.0.ptr(), planned.1.ptr());
                    drop(planned);
                    pool.step(device).unwrap();
                    s.synchronize().unwrap();

                    // The capture allocates as an iteration does: the plan's places.
                    s.begin_capture(None).unwrap();
                    let (a, b) = iteration();
                    let graph = s.end_capture().unwrap();
                    let (in_graph_a, in_graph_b) = (a.ptr(), b.ptr());
                    assert_eq!((in_graph_a, in_graph_b), (a_at, b_at), "the capture was served by the plan");
                    drop((a, b));
                    pool.step(device).unwrap();
                    // Eager iterations while the graph lives get other memory, and the replays
                    // leave it alone.
                    for _ in 0..2 {
                        let (x, y) = iteration();
                        for p in [x.ptr(), y.ptr()] {
                            assert!(p != in_graph_a && p != in_graph_b, "the graph's memory was lent");
                        }
                        s.synchronize().unwrap();
                        x.memset(7, N).unwrap();
                        y.memset(8, 2 * N).unwrap();
                        graph.launch(Some(&s)).unwrap();
                        s.synchronize().unwrap();
                        assert_eq!(read(&x, N), vec![7u8; N]);
                        assert_eq!(read(&y, 2 * N), vec![8u8; 2 * N]);
                        drop((x, y));
                        pool.step(device).unwrap();
                    }
                    drop(graph);
                    s.synchronize().unwrap();
                    // Once the graph is gone its memory comes back: nothing is lost. The eager
                    // iterations departed from the plan (its places were the graph's), so the
                    // pool records the loop again and plans it anew.
                    assert_eq!(pool.used_bytes(), 0, "every byte came back");
                    for _ in 0..3 {
                        drop(iteration());
                        pool.step(device).unwrap();
                    }
                    let stats = pool.device_pool(device).unwrap().pool().plan_stats();
                    assert_eq!(stats.state, gpumem::core::pool::PlanState::Planned, "{stats:?}");
                    assert!(stats.departed > 0 && stats.plans >= 2, "{stats:?}");
                    s.synchronize().unwrap();
                }

                fn a_capture_with_a_forked_stream_lends_nothing_again() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let joined = Stream::non_blocking().unwrap();
                    let _current = s.enter().unwrap();
                    s.begin_capture(None).unwrap();
                    // Memory touched on another stream of the capture is not lent again.
                    let fork = s.record(None).unwrap();
                    joined.wait_event(&fork).unwrap();
                    let a = pool.malloc(N).unwrap();
                    let first = a.ptr();
                    a.memset_async(1, N, Some(&joined)).unwrap();
                    drop(a);
                    // Nor memory the capture's own stream alone touched once a stream has forked:
                    // the forked stream's later work is not ordered after it.
                    let c = pool.malloc(N).unwrap();
                    let second = c.ptr();
                    c.memset_async(2, N, None).unwrap();
                    drop(c);
                    let b = pool.malloc(N).unwrap();
                    assert!(b.ptr() != first && b.ptr() != second, "nothing is lent again after a fork");
                    b.memset_async(3, N, Some(&joined)).unwrap();
                    s.wait_event(&joined.record(None).unwrap()).unwrap();
                    let graph = s.end_capture().unwrap();
                    drop(_current);
                    graph.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(read(&b, N), vec![3u8; N]);
                }

                fn a_peer_copy_keeps_its_source_until_it_ran() {
                    if Device::count().unwrap() < 2 {
                        return;
                    }
                    let src = own_memory(N);
                    src.memset(5, N).unwrap();
                    let (dst, s1) = {
                        let _d1 = Device::new(1).enter().unwrap();
                        (own_memory(N), Stream::non_blocking().unwrap())
                    };
                    busy(&s1, 100);
                    dst.copy_from_device_async(&src, N, Some(&s1)).unwrap();
                    drop(src);
                    s1.synchronize().unwrap();
                    assert!(read(&dst, N).iter().all(|&x| x == 5));
                }

                fn the_last_pointer_dropped_in_a_host_function_does_not_free_queued_work() {
                    let s = Stream::non_blocking().unwrap();
                    let p = own_memory(N);
                    let mut last = Some(p.clone());
                    s.launch_host_func(move || {
                        std::thread::sleep(Duration::from_millis(50));
                        drop(last.take());
                    })
                    .unwrap();
                    p.memset_async(3, N, Some(&s)).unwrap();
                    let kept = p.clone();
                    drop(p);
                    s.synchronize().unwrap();
                    assert!(read(&kept, N).iter().all(|&x| x == 3));
                }

                fn pinned_reads_and_writes_wait_for_transfers_on_their_bytes() {
                    let s = Stream::non_blocking().unwrap();
                    let dev = own_memory(N);
                    dev.memset(3, N).unwrap();
                    let pinned = PinnedMemoryPointer::alloc(N).unwrap();
                    busy(&s, 100);
                    dev.copy_to_host_async(&pinned, N, Some(&s)).unwrap();
                    pinned.write(&[9u8; N]).unwrap();
                    s.synchronize().unwrap();
                    let mut back = vec![0u8; N];
                    pinned.read(&mut back).unwrap();
                    assert!(back.iter().all(|&x| x == 9), "the transfer overwrote a later write");
                }

                fn a_copy_from_pinned_memory_waits_for_a_transfer_queued_into_it() {
                    let s = Stream::non_blocking().unwrap();
                    let src = own_memory(N);
                    src.memset(3, N).unwrap();
                    let pinned = PinnedMemoryPointer::alloc(N).unwrap();
                    pinned.write(&[9u8; N]).unwrap();
                    busy(&s, 100);
                    src.copy_to_host_async(&pinned, N, Some(&s)).unwrap();
                    let dst = own_memory(N);
                    dst.copy_from(&pinned, N).unwrap();
                    assert!(read(&dst, N).iter().all(|&x| x == 3), "the copy read the pinned bytes before the transfer");
                    s.synchronize().unwrap();
                }

                fn freeing_pinned_memory_does_not_wait_for_unrelated_streams() {
                    let s = Stream::non_blocking().unwrap();
                    // Allocated first: pinning memory may itself wait for the device on CUDA.
                    let unrelated = PinnedMemoryPointer::alloc(N).unwrap();
                    let (tx, rx) = mpsc::channel::<()>();
                    let rx = Mutex::new(rx);
                    s.launch_host_func(move || {
                        let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
                    })
                    .unwrap();
                    let t = Instant::now();
                    drop(unrelated);
                    assert!(t.elapsed() < Duration::from_secs(5), "the free waited for a stream waiting for us");
                    tx.send(()).unwrap();
                    s.synchronize().unwrap();
                }

                fn a_stream_kept_from_a_callback_stays_valid() {
                    let s = Stream::non_blocking().unwrap();
                    let kept: Arc<Mutex<Option<Stream>>> = Arc::default();
                    let k = Arc::clone(&kept);
                    s.add_callback(move |stream, status| {
                        status.unwrap();
                        *k.lock().unwrap() = Some(stream.clone());
                    })
                    .unwrap();
                    s.synchronize().unwrap();
                    drop(s);
                    let view = kept.lock().unwrap().take().expect("the callback ran");
                    assert!(view.query().unwrap());
                    view.synchronize().unwrap();
                    busy(&view, 1);
                    view.synchronize().unwrap();
                }

                fn host_functions_of_a_capture_belong_to_it_whatever_stream_value_launched_them() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let runs = Arc::new(AtomicUsize::new(0));
                    let r = Arc::clone(&runs);
                    // Two values for one stream: the stream itself and a foreign wrapper of its
                    // handle. (A non-blocking stream, so that other tests' work on the legacy
                    // stream cannot invalidate the capture, as it would a per-thread stream's.)
                    let s1 = Stream::non_blocking().unwrap();
                    s1.begin_capture(None).unwrap();
                    // SAFETY: `s1` is live, and outlives `s2`'s use below.
                    let s2 = unsafe { gpumem::ExternalStream::from_ptr(s1.ptr(), s1.device_id()) };
                    s2.launch_host_func(move || {
                        r.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                    let g = s1.end_capture().unwrap();
                    drop((s1, s2));
                    let s = Stream::non_blocking().unwrap();
                    g.launch(Some(&s)).unwrap();
                    g.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(runs.load(Ordering::SeqCst), 2);
                }

                fn a_graph_launched_inside_a_capture_is_kept_by_the_outer_graph() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let runs = Arc::new(AtomicUsize::new(0));
                    let r = Arc::clone(&runs);
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    s.launch_host_func(move || {
                        r.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                    let inner = s.end_capture().unwrap();
                    s.begin_capture(None).unwrap();
                    if inner.launch(Some(&s)).is_err() {
                        // CUDA refuses a graph launch into a capturing stream; the host backend
                        // captures it. Refused, there is nothing for an outer graph to keep.
                        assert!(s.end_capture().is_err());
                        return;
                    }
                    let outer = s.end_capture().unwrap();
                    drop(inner);
                    outer.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(runs.load(Ordering::SeqCst), 1);
                }

                fn launching_host_functions_while_another_thread_captures_the_stream() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    let stop = Arc::new(AtomicUsize::new(0));
                    std::thread::scope(|scope| {
                        let (s2, stop2) = (s.clone(), Arc::clone(&stop));
                        scope.spawn(move || {
                            while stop2.load(Ordering::SeqCst) == 0 {
                                let _ = s2.launch_host_func(|| {});
                            }
                        });
                        for _ in 0..50 {
                            s.begin_capture(None).unwrap();
                            // The other thread's launches are captured or not, never half.
                            if let Ok(g) = s.end_capture() {
                                g.launch(Some(&s)).unwrap();
                                g.launch(Some(&s)).unwrap();
                            }
                        }
                        stop.store(1, Ordering::SeqCst);
                    });
                    s.synchronize().unwrap();
                }

                fn a_graph_dropped_inside_a_host_function_queued_before_its_launch() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    s.launch_host_func(|| {}).unwrap();
                    let g = s.end_capture().unwrap();
                    let slot = Arc::new(Mutex::new(None));
                    let in_fn = Arc::clone(&slot);
                    s.launch_host_func(move || drop(in_fn.lock().unwrap().take())).unwrap();
                    g.launch(Some(&s)).unwrap();
                    *slot.lock().unwrap() = Some(g);
                    s.synchronize().unwrap();
                    s.synchronize().unwrap();
                }

                fn host_functions_that_wait_for_streams_are_refused_not_hung() {
                    let s1 = Stream::non_blocking().unwrap();
                    let s2 = Stream::non_blocking().unwrap();
                    let results = Arc::new(Mutex::new(Vec::new()));
                    for (a, b) in [(&s1, &s2), (&s2, &s1)] {
                        let (other, out) = (b.clone(), Arc::clone(&results));
                        a.launch_host_func(move || out.lock().unwrap().push(other.synchronize())).unwrap();
                    }
                    s1.synchronize().unwrap();
                    s2.synchronize().unwrap();
                    let results = results.lock().unwrap();
                    assert_eq!(results.len(), 2);
                    assert!(results.iter().all(|r| matches!(r, Err(Error::NotAllowedInCallback { .. }))), "{results:?}");
                }

                fn a_panic_whose_payload_panics_on_drop_is_reported() {
                    struct Nasty;
                    impl Drop for Nasty {
                        fn drop(&mut self) {
                            panic!("the payload's drop panicked");
                        }
                    }
                    let s = Stream::non_blocking().unwrap();
                    s.launch_host_func(|| std::panic::panic_any(Nasty)).unwrap();
                    assert!(matches!(s.synchronize(), Err(Error::CallbackPanicked(_))));
                    s.synchronize().unwrap();
                }

                fn a_callback_panic_is_reported_to_its_own_thread_only() {
                    let (ran_tx, ran_rx) = mpsc::channel::<()>();
                    let (checked_tx, checked_rx) = mpsc::channel::<()>();
                    std::thread::scope(|scope| {
                        scope.spawn(move || {
                            let s = Stream::per_thread();
                            s.launch_host_func(|| panic!("thread A's host function")).unwrap();
                            s.launch_host_func(move || {
                                let _ = ran_tx.send(());
                            })
                            .unwrap();
                            checked_rx.recv().unwrap();
                            assert!(matches!(s.synchronize(), Err(Error::CallbackPanicked(m)) if m.contains("thread A")));
                        });
                        ran_rx.recv().unwrap();
                        // Another thread's per-thread stream has its own identity.
                        let mine = std::thread::scope(|inner| inner.spawn(|| Stream::per_thread().synchronize()).join().unwrap());
                        checked_tx.send(()).unwrap();
                        assert!(mine.is_ok(), "{mine:?}");
                    });
                }

                fn work_on_memory_of_another_device_than_its_stream_is_refused() {
                    if Device::count().unwrap() < 2 {
                        return;
                    }
                    let m0 = own_memory(N);
                    let (s1, e1) = {
                        let _d1 = Device::new(1).enter().unwrap();
                        (Stream::non_blocking().unwrap(), Event::new().unwrap())
                    };
                    assert!(matches!(m0.memset_async(1, N, Some(&s1)), Err(Error::WrongDevice { .. })));
                    let s0 = Stream::non_blocking().unwrap();
                    assert!(matches!(e1.record(Some(&s0)), Err(Error::WrongDevice { .. })));
                }

                fn a_device_wide_synchronize_is_refused_while_a_stream_captures() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    assert!(Device::current().synchronize().is_err());
                    // The capture is invalidated, as CUDA does.
                    assert!(s.end_capture().is_err());
                }

                // Work on the memory's own stream keeps nothing alive and records no event (the
                // pool lends the memory again only to that stream's later work). Everything else
                // that touches the memory must still wait for it.

                fn a_synchronous_access_waits_for_work_on_the_memorys_own_stream() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let a = own_stream_chunk(&pool, &s);
                    busy(&s, 100);
                    a.memset_async(2, N, Some(&s)).unwrap();
                    assert!(read(&a, N).iter().all(|&x| x == 2), "the read ran before the memset");
                }

                fn memory_freed_under_its_own_streams_work_is_written_only_after_it() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let a = own_stream_chunk(&pool, &s);
                    let address = a.ptr();
                    busy(&s, 100);
                    a.memset_async(0xAA, N, Some(&s)).unwrap();
                    drop(a);
                    // Lent again at once, to the same stream: a synchronous write waits for the
                    // stream's queued memset.
                    let b = own_stream_chunk(&pool, &s);
                    assert_eq!(b.ptr(), address, "the pool lent the chunk again");
                    b.memset(0x11, N).unwrap();
                    s.synchronize().unwrap();
                    assert!(read(&b, N).iter().all(|&x| x == 0x11), "the queued write reached the new owner");
                }

                fn another_stream_waits_for_work_on_the_memorys_own_stream() {
                    later_memset_lands_last(true);
                }

                fn the_own_stream_waits_for_another_streams_work_on_the_memory() {
                    later_memset_lands_last(false);
                }

                fn releasing_the_pools_memory_waits_for_work_on_its_own_stream() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let a = own_stream_chunk(&pool, &s);
                    let done = held_memset_then_count(&s, &a);
                    drop(a);
                    pool.free_all_blocks(None);
                    assert_eq!(pool.total_bytes(), 0);
                    assert_eq!(done.load(Ordering::SeqCst), 1, "the block was freed under the queued memset");
                }

                fn destroying_a_stream_waits_for_work_on_its_memory() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let a = own_stream_chunk(&pool, &s);
                    let done = held_memset_then_count(&s, &a);
                    drop(a);
                    // The arena keyed by the stream's handle may serve a new stream with the same
                    // handle: the old stream's work on its memory is done before it goes.
                    drop(s);
                    assert_eq!(done.load(Ordering::SeqCst), 1, "the stream went with work on its memory queued");
                }

                fn a_graph_launched_on_another_stream_waits_for_work_queued_before_its_capture() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let other = Stream::non_blocking().unwrap();
                    let a = own_stream_chunk(&pool, &s);
                    busy(&s, 100);
                    a.memset_async(1, N, Some(&s)).unwrap();
                    s.begin_capture(None).unwrap();
                    a.memset_async(2, N, Some(&s)).unwrap();
                    let g = s.end_capture().unwrap();
                    g.launch(Some(&other)).unwrap();
                    other.synchronize().unwrap();
                    s.synchronize().unwrap();
                    assert!(read(&a, N).iter().all(|&x| x == 2), "the replay ran before the eager memset");
                }

                fn a_synchronous_memset_is_ordered_with_another_threads_memset_on_the_memorys_stream() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    sync_and_async_memsets_race(own_stream_chunk(&pool, &s), &s);
                }

                // RACE01-03: two threads touching the same bytes through gpumem at once. Each
                // access is ordered with the other thread's (the data race these scenarios had is
                // what ThreadSanitizer and Miri check); the bytes end up all one value or the other.

                fn a_pinned_write_is_ordered_with_another_threads_transfer_into_it() {
                    let rounds = race_rounds();
                    let dev = own_memory(N);
                    dev.memset(0x33, N).unwrap();
                    let pinned = PinnedMemoryPointer::alloc(N).unwrap();
                    let s = Stream::non_blocking().unwrap();
                    let writer = pinned.clone();
                    let t = std::thread::spawn(move || {
                        for _ in 0..rounds {
                            writer.write(&[0x22u8; N]).unwrap();
                        }
                    });
                    for _ in 0..rounds {
                        dev.copy_to_host_async(&pinned, N, Some(&s)).unwrap();
                    }
                    s.synchronize().unwrap();
                    t.join().unwrap();
                    let mut back = vec![0u8; N];
                    pinned.read(&mut back).unwrap();
                    assert_one_value(&back, &[0x22, 0x33]);
                }

                fn a_synchronous_memset_is_ordered_with_another_threads_async_memset() {
                    let p = MemoryPool::new().malloc(N).unwrap();
                    sync_and_async_memsets_race(p, &Stream::non_blocking().unwrap());
                }

                fn async_memsets_of_two_threads_on_their_own_streams_are_ordered() {
                    let rounds = race_rounds();
                    let p = MemoryPool::new().malloc(N).unwrap();
                    let q = p.clone();
                    let t = std::thread::spawn(move || {
                        let s = Stream::non_blocking().unwrap();
                        for _ in 0..rounds {
                            q.memset_async(0x22, N, Some(&s)).unwrap();
                        }
                        s.synchronize().unwrap();
                    });
                    let s = Stream::non_blocking().unwrap();
                    for _ in 0..rounds {
                        p.memset_async(0x33, N, Some(&s)).unwrap();
                    }
                    s.synchronize().unwrap();
                    t.join().unwrap();
                    assert_one_value(&read(&p, N), &[0x22, 0x33]);
                }

                fn pointer_offsets_are_exact_past_isize() {
                    let p = own_memory(64);
                    let q = (&p + isize::MAX + 10) - isize::MAX;
                    assert_eq!(q.offset(), 10);
                    q.memset(1, 1).unwrap();
                    assert_eq!(read(&p, 11)[10], 1);
                }
            }
        }
    };
}
