//! Memory lent across streams (`SingleDeviceMemoryPool::set_share_across_streams`): a stream that
//! borrows another stream's free memory is ordered after that stream's queued work, and the memory
//! goes back to its owner only after the borrower's work has run.

/// The `share` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __share_tests {
    ($flavor:ident) => {
        mod share {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::{Arc, Mutex};
            use std::time::{Duration, Instant};

            use gpumem::{MemoryPointer, Stream};

            type Pool = gpumem::core::SingleDeviceMemoryPool<gpumem::DefaultBackend>;

            const N: usize = 4096;

            fn sharing_pool() -> Pool {
                let pool = Pool::new(gpumem::Device::current().id()).unwrap();
                pool.set_share_across_streams(true);
                pool
            }

            fn malloc_on(pool: &Pool, s: &Stream) -> MemoryPointer {
                let _g = s.enter().unwrap();
                pool.malloc(N).unwrap()
            }

            /// Queues a host function that keeps `s` busy for `ms` milliseconds and notes when it
            /// ended. Timestamps, not a wait on the host, tell the order of two streams' work: a
            /// device-wide wait elsewhere (another test's) may stall this thread for any time.
            fn busy(s: &Stream, ms: u64) -> Arc<Mutex<Option<Instant>>> {
                let ended = Arc::new(Mutex::new(None));
                let at = Arc::clone(&ended);
                s.launch_host_func(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    *at.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
                ended
            }

            /// Streams `a` and `b`, a chunk `a` freed lent to `b` (`q`, at `address`), and `b`
            /// kept busy for 300 ms after it (`borrower_done` notes when).
            struct LentToBusyBorrower {
                a: Stream,
                b: Stream,
                address: usize,
                q: MemoryPointer,
                borrower_done: Arc<Mutex<Option<Instant>>>,
            }

            fn lend_to_busy_borrower(pool: &Pool) -> LentToBusyBorrower {
                let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
                let address = malloc_on(pool, &a).ptr();
                let q = malloc_on(pool, &b);
                assert_eq!(q.ptr(), address);
                let borrower_done = busy(&b, 300);
                LentToBusyBorrower { a, b, address, q, borrower_done }
            }

            /// Whether `r`, lent at `lent_at`, is the borrowed chunk at `address` back already; it
            /// may be only if the borrower's work had run by then (this thread may have been
            /// stalled).
            fn back_early(
                r: &MemoryPointer,
                address: usize,
                borrower_done: &Mutex<Option<Instant>>,
                lent_at: Instant,
            ) -> bool {
                if r.ptr() != address {
                    return false;
                }
                let done = *borrower_done.lock().unwrap();
                assert!(done.is_some_and(|d| d <= lent_at), "a was lent memory b's queued work may use");
                true
            }

            /// Notes when a host function queued on `s` ran.
            fn mark(s: &Stream) -> Arc<Mutex<Option<Instant>>> {
                let ran = Arc::new(Mutex::new(None));
                let at = Arc::clone(&ran);
                s.launch_host_func(move || *at.lock().unwrap() = Some(Instant::now())).unwrap();
                ran
            }

            conformance! {
                fn a_stream_that_borrows_memory_waits_for_the_owners_queued_work() {
                    // No memory is lent across streams while a stream captures: not beside the
                    // capture tests.
                    let _serial = $crate::capture_lock();
                    let pool = sharing_pool();
                    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
                    let p = malloc_on(&pool, &a);
                    let address = p.ptr();
                    // Work of the program's own may still use p on a: a is busy, and p freed.
                    let owner_done = busy(&a, 200);
                    drop(p);
                    let q = malloc_on(&pool, &b);
                    assert_eq!(q.ptr(), address, "b's arena is empty: it borrows a's free chunk");
                    assert_eq!(pool.stats().all.lent_across_streams, 1);
                    let ran = mark(&b);
                    b.synchronize().unwrap();
                    let (ran, owner_done) = (ran.lock().unwrap().unwrap(), owner_done.lock().unwrap());
                    let owner_done = owner_done.expect("b ran while the work queued on a was not done");
                    assert!(ran >= owner_done, "b ran before the work queued on a was done");
                    drop(q);
                }

                fn borrowed_memory_returns_to_its_owner_after_the_borrowers_work() {
                    // No memory is lent across streams while a stream captures: not beside the
                    // capture tests.
                    let _serial = $crate::capture_lock();
                    let pool = sharing_pool();
                    let LentToBusyBorrower { a, b, address, q, borrower_done } = lend_to_busy_borrower(&pool);
                    drop(q); // b's queued work may still use it
                    let r = malloc_on(&pool, &a);
                    if back_early(&r, address, &borrower_done, Instant::now()) {
                        return;
                    }
                    b.synchronize().unwrap();
                    let s = malloc_on(&pool, &a);
                    assert_eq!(s.ptr(), address, "back in a's arena once b's work ran");
                }

                fn a_chunk_returned_while_its_borrower_captures_waits_for_the_work_before() {
                    let _serial = $crate::capture_lock();
                    if !super::supports_capture() {
                        return;
                    }
                    let pool = sharing_pool();
                    let LentToBusyBorrower { a, b, address, q, borrower_done } = lend_to_busy_borrower(&pool);
                    // Dropped while b captures: an event recorded now would go into the graph
                    // and mark none of the work queued on b before the capture.
                    b.begin_capture(None).unwrap();
                    drop(q);
                    let r = malloc_on(&pool, &a);
                    let lent_at = Instant::now();
                    drop(b.end_capture().unwrap());
                    if back_early(&r, address, &borrower_done, lent_at) {
                        return;
                    }
                    b.synchronize().unwrap();
                    // Back once b's work ran: each miss looks at the fence again.
                    let mut held = vec![r];
                    let deadline = Instant::now() + Duration::from_secs(5);
                    loop {
                        let s = malloc_on(&pool, &a);
                        if s.ptr() == address {
                            break;
                        }
                        assert!(Instant::now() < deadline, "the chunk never came back to a");
                        held.push(s);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }

                fn memory_stays_with_its_stream_unless_sharing_is_on() {
                    let pool = Pool::new(gpumem::Device::current().id()).unwrap();
                    assert!(!pool.pool().shares_across_streams());
                    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
                    let address = malloc_on(&pool, &a).ptr();
                    assert_ne!(malloc_on(&pool, &b).ptr(), address, "CuPy's rule: no lending across streams");
                    assert_eq!(pool.stats().all.lent_across_streams, 0);
                }

                fn a_per_thread_default_stream_neither_lends_nor_borrows() {
                    let pool = sharing_pool();
                    let a = Stream::non_blocking().unwrap();
                    let address = malloc_on(&pool, &a).ptr();
                    let q = malloc_on(&pool, &Stream::per_thread());
                    assert_ne!(q.ptr(), address, "the per-thread stream cannot be named from another thread");
                    drop(q);
                    assert_eq!(pool.stats().all.lent_across_streams, 0);
                }
            }
        }
    };
}
