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

            use std::sync::atomic::{AtomicBool, Ordering};
            use std::sync::{mpsc, Arc, Mutex};
            use std::time::Duration;

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

            /// Holds `s` with a host function until the returned sender is used or dropped (ten
            /// seconds at most, so that a device-wide wait elsewhere cannot hang for good).
            fn hold(s: &Stream) -> mpsc::Sender<()> {
                let (go, wait) = mpsc::channel::<()>();
                let wait = Mutex::new(wait);
                s.launch_host_func(move || {
                    let _ = wait.lock().map(|w| w.recv_timeout(Duration::from_secs(10)));
                })
                .unwrap();
                go
            }

            /// A flag a host function queued on `s` sets.
            fn mark(s: &Stream) -> Arc<AtomicBool> {
                let ran = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&ran);
                s.launch_host_func(move || flag.store(true, Ordering::SeqCst)).unwrap();
                ran
            }

            conformance! {
                fn a_stream_that_borrows_memory_waits_for_the_owners_queued_work() {
                    let pool = sharing_pool();
                    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
                    let p = malloc_on(&pool, &a);
                    let address = p.ptr();
                    // Work of the program's own may still use p on a: a is held, and p freed.
                    let go = hold(&a);
                    drop(p);
                    let q = malloc_on(&pool, &b);
                    assert_eq!(q.ptr(), address, "b's arena is empty: it borrows a's free chunk");
                    assert_eq!(pool.stats().all.lent_across_streams, 1);
                    let ran = mark(&b);
                    std::thread::sleep(Duration::from_millis(50));
                    assert!(!ran.load(Ordering::SeqCst), "b ran before the work queued on a");
                    go.send(()).unwrap();
                    b.synchronize().unwrap();
                    assert!(ran.load(Ordering::SeqCst));
                    drop(q);
                    a.synchronize().unwrap();
                }

                fn borrowed_memory_returns_to_its_owner_after_the_borrowers_work() {
                    let pool = sharing_pool();
                    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
                    let address = malloc_on(&pool, &a).ptr();
                    let q = malloc_on(&pool, &b);
                    assert_eq!(q.ptr(), address);
                    let go = hold(&b);
                    drop(q); // b's queued work may still use it
                    let r = malloc_on(&pool, &a);
                    assert_ne!(r.ptr(), address, "a was lent memory b's queued work may use");
                    go.send(()).unwrap();
                    b.synchronize().unwrap();
                    let s = malloc_on(&pool, &a);
                    assert_eq!(s.ptr(), address, "back in a's arena once b's work ran");
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
