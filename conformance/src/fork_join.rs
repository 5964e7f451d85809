//! Streams joining and leaving a capture through events (fork and join), with the errors CUDA
//! gives when a capture is ended unjoined, ended on the wrong stream, or crosses into other work.
//! The host backend follows what CUDA does here; a backend without capture skips these.

/// The `fork_join` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __fork_join_tests {
    ($flavor:ident) => {
        mod fork_join {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::Arc;

            use gpumem::{Error, Stream};

            use super::supports_capture;
            use $crate::read;

            /// CUDA's numbers, which the host backend's errors carry too.
            const UNMATCHED: i64 = 903;
            const UNJOINED: i64 = 904;
            const ISOLATION: i64 = 905;
            const MERGE: i64 = 902;
            const CAPTURED_EVENT: i64 = 907;

            fn code(e: Error) -> Option<i64> {
                e.code()
            }

            /// Two non-blocking streams; the first begins a capture, the second joins it.
            fn forked() -> (Stream, Stream) {
                let origin = Stream::non_blocking().unwrap();
                let joined = Stream::non_blocking().unwrap();
                origin.begin_capture(None).unwrap();
                let fork = origin.record(None).unwrap();
                assert!(!joined.is_capturing().unwrap());
                joined.wait_event(&fork).unwrap();
                assert!(joined.is_capturing().unwrap(), "waiting for a captured event joins the capture");
                (origin, joined)
            }

            fn join(origin: &Stream, joined: &Stream) {
                let back = joined.record(None).unwrap();
                origin.wait_event(&back).unwrap();
            }

            conformance! {
                fn a_forked_stream_is_captured_into_the_same_graph() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let a = gpumem::alloc(512).unwrap();
                    let b = gpumem::alloc(512).unwrap();
                    let runs = Arc::new(AtomicUsize::new(0));
                    let (origin, joined) = forked();
                    a.memset_async(0x5A, 512, Some(&origin)).unwrap();
                    b.memset_async(0xA5, 512, Some(&joined)).unwrap();
                    let r = runs.clone();
                    joined
                        .launch_host_func(move || {
                            r.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    join(&origin, &joined);
                    assert!(joined.is_capturing().unwrap(), "a joined stream stays in the capture until it ends");
                    let graph = origin.end_capture().unwrap();
                    assert!(!joined.is_capturing().unwrap(), "ending the capture releases every stream in it");
                    assert_eq!(runs.load(Ordering::SeqCst), 0, "capturing runs nothing");
                    for replay in 1..=2 {
                        graph.launch(Some(&origin)).unwrap();
                        origin.synchronize().unwrap();
                        assert_eq!(runs.load(Ordering::SeqCst), replay);
                    }
                    assert_eq!(read(&a, 512), [0x5Au8; 512]);
                    assert_eq!(read(&b, 512), [0xA5u8; 512]);
                    // The joined stream works eagerly again.
                    b.memset_async(1, 512, Some(&joined)).unwrap();
                    joined.synchronize().unwrap();
                    assert_eq!(read(&b, 512), [1u8; 512]);
                }

                fn a_graph_owns_what_its_forked_streams_touched() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let pool = gpumem::MemoryPool::new();
                    let token = Arc::new(());
                    let (origin, joined) = forked();
                    let b = pool.malloc(4096).unwrap();
                    b.memset_async(6, 4096, Some(&joined)).unwrap();
                    let t = Arc::clone(&token);
                    joined.launch_host_func(move || drop(&t)).unwrap();
                    join(&origin, &joined);
                    drop(b);
                    let graph = origin.end_capture().unwrap();
                    assert_eq!(pool.used_bytes(), 4096, "the graph keeps the chunk its forked stream writes");
                    assert_eq!(Arc::strong_count(&token), 2, "and the host function it calls");
                    graph.launch(Some(&origin)).unwrap();
                    origin.synchronize().unwrap();
                    drop(graph);
                    joined.synchronize().unwrap();
                    assert_eq!(pool.used_bytes(), 0, "dropping the graph gives the chunk back");
                    assert_eq!(Arc::strong_count(&token), 1, "and drops the host function");
                }

                fn a_fork_that_captured_work_must_be_joined() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let b = gpumem::alloc(512).unwrap();
                    let (origin, joined) = forked();
                    b.memset_async(2, 512, Some(&joined)).unwrap();
                    assert_eq!(origin.end_capture().err().and_then(code), Some(UNJOINED));
                    assert!(!origin.is_capturing().unwrap() && !joined.is_capturing().unwrap(), "the capture is over");
                    b.memset_async(3, 512, Some(&joined)).unwrap();
                    joined.synchronize().unwrap();
                    assert_eq!(read(&b, 512), [3u8; 512]);

                    // Work queued on the forked stream after its join is unjoined too.
                    let (origin, joined) = forked();
                    b.memset_async(4, 512, Some(&joined)).unwrap();
                    join(&origin, &joined);
                    b.memset_async(5, 512, Some(&joined)).unwrap();
                    assert_eq!(origin.end_capture().err().and_then(code), Some(UNJOINED));

                    // A fork that captured nothing needs no join.
                    let (origin, joined) = forked();
                    origin.end_capture().unwrap();
                    assert!(!joined.is_capturing().unwrap());
                }

                fn a_capture_ends_only_on_the_stream_that_began_it() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let (origin, joined) = forked();
                    join(&origin, &joined);
                    assert!(joined.begin_capture(None).is_err(), "a joined stream already captures");
                    assert!(origin.is_capturing().unwrap(), "a refused begin changes nothing");
                    assert_eq!(joined.end_capture().err().and_then(code), Some(UNMATCHED));
                    assert!(matches!(origin.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(matches!(joined.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(origin.end_capture().is_err());
                    assert!(!origin.is_capturing().unwrap() && !joined.is_capturing().unwrap());
                }

                fn a_capture_cannot_wait_for_work_outside_it() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let other = Stream::non_blocking().unwrap();
                    let outside = other.record(None).unwrap();
                    other.synchronize().unwrap();
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    assert_eq!(s.wait_event(&outside).err().and_then(code), Some(ISOLATION));
                    assert!(matches!(s.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(s.end_capture().is_err());

                    // Nor can two captures merge.
                    let first = Stream::non_blocking().unwrap();
                    let second = Stream::non_blocking().unwrap();
                    first.begin_capture(None).unwrap();
                    second.begin_capture(None).unwrap();
                    let inside_first = first.record(None).unwrap();
                    assert_eq!(second.wait_event(&inside_first).err().and_then(code), Some(MERGE));
                    assert!(matches!(first.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(matches!(second.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(first.end_capture().is_err() && second.end_capture().is_err());
                }

                fn an_event_recorded_in_a_capture_is_not_a_point_in_time() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    let e = s.record(None).unwrap();
                    assert_eq!(e.query().err().and_then(code), Some(CAPTURED_EVENT));
                    assert!(!e.done(), "a failed query reads as not done");
                    assert!(matches!(s.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(s.end_capture().is_err());
                    // Once its capture is over the event is invalid until recorded again.
                    assert!(e.synchronize().is_err());
                    assert!(Stream::non_blocking().unwrap().wait_event(&e).is_err());
                    e.record(Some(&s)).unwrap();
                    e.synchronize().unwrap();
                    assert!(e.query().unwrap());
                }
            }
        }
    };
}
