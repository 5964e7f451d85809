//! Stream capture and graphs (every backend but HIP, where each capture call is refused).

/// The `capture` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __capture_tests {
    ($flavor:ident) => {
        mod capture {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::Arc;

            use gpumem::{Error, Stream};

            use super::supports_capture;
            use $crate::read;

            conformance! {
                fn captured_work_replays_three_times() {
                    let _serial = $crate::capture_lock();
                    let s = Stream::non_blocking().unwrap();
                    if !supports_capture() {
                        assert!(matches!(s.begin_capture(None), Err(Error::Unsupported { .. })));
                        assert!(matches!(s.is_capturing(), Err(Error::Unsupported { .. })));
                        assert!(matches!(s.end_capture(), Err(Error::Unsupported { .. })));
                        return;
                    }
                    let a = gpumem::alloc(1024).unwrap();
                    let b = gpumem::alloc(1024).unwrap();
                    let runs = Arc::new(AtomicUsize::new(0));
                    {
                        let _g = s.enter().unwrap();
                        s.begin_capture(None).unwrap();
                        assert!(s.is_capturing().unwrap());
                        a.memset_async(0x11, 1024, None).unwrap();
                        (&a + 512).memset_async(0x22, 512, None).unwrap();
                        b.copy_from_device_async(&a, 1024, None).unwrap();
                        let r = runs.clone();
                        s.launch_host_func(move || {
                            r.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    }
                    let graph = s.end_capture().unwrap();
                    assert!(!s.is_capturing().unwrap());
                    assert_eq!(runs.load(Ordering::SeqCst), 0, "capturing runs nothing");
                    for replay in 1..=3 {
                        b.memset(0, 1024).unwrap();
                        graph.launch(Some(&s)).unwrap();
                        s.synchronize().unwrap();
                        let back = read(&b, 1024);
                        assert!(back[..512].iter().all(|&x| x == 0x11) && back[512..].iter().all(|&x| x == 0x22));
                        assert_eq!(runs.load(Ordering::SeqCst), replay, "the host function runs on every replay");
                    }
                    graph.upload(Some(&s)).unwrap();
                    let other = Stream::new().unwrap();
                    graph.launch(Some(&other)).unwrap();
                    other.synchronize().unwrap();
                    assert_eq!(runs.load(Ordering::SeqCst), 4);
                }

                fn capture_is_refused_on_the_default_streams() {
                    let _serial = $crate::capture_lock();
                    for s in [Stream::null(), gpumem::core::Stream::legacy()] {
                        let err = s.begin_capture(None).unwrap_err();
                        assert!(matches!(err, Error::CaptureOnDefaultStream), "{err:?}");
                        assert_eq!(err.to_string(), "cannot capture on the default (legacy) stream");
                    }
                }

                fn synchronous_transfers_are_refused_while_capturing() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    let p = gpumem::alloc(64).unwrap();
                    let mut host = [0u8; 8];
                    let _g = s.enter().unwrap();
                    s.begin_capture(None).unwrap();
                    let msg = "the current stream is capturing, so synchronous API calls are disallowed";
                    for r in [p.memset(0, 8), p.copy_to_host(&mut host, 8), p.copy_from_host(&[0; 8], 8), p.memset(0, 0)] {
                        assert_eq!(r.unwrap_err().to_string(), msg);
                    }
                    let pinned = gpumem::PinnedMemoryPointer::alloc(8).unwrap();
                    assert_eq!(
                        p.copy_from_host_async(&pinned, 8, None).unwrap_err().to_string(),
                        "the current stream is capturing, so H2D transfers are disallowed"
                    );
                    assert_eq!(
                        p.copy_to_host_async(&pinned, 8, None).unwrap_err().to_string(),
                        "the current stream is capturing, so D2H transfers are disallowed"
                    );
                    p.memset_async(1, 8, None).unwrap();
                    let graph = s.end_capture().unwrap();
                    drop(_g);
                    graph.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(read(&p, 8), [1u8; 8]);
                }

                fn an_invalidated_capture_is_an_error_not_false() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    s.begin_capture(None).unwrap();
                    // Synchronising a capturing stream is illegal and invalidates the capture.
                    assert!(s.synchronize().is_err());
                    assert!(matches!(s.is_capturing(), Err(Error::CaptureInvalidated)));
                    assert!(s.end_capture().is_err());
                    assert!(!s.is_capturing().unwrap(), "the failed end_capture ended the capture");
                    assert!(s.end_capture().is_err(), "not capturing");
                }

                fn a_graph_prints_as_dot() {
                    let _serial = $crate::capture_lock();
                    if !supports_capture() {
                        return;
                    }
                    let s = Stream::non_blocking().unwrap();
                    let a = gpumem::alloc(1024).unwrap();
                    let b = gpumem::alloc(1024).unwrap();
                    s.begin_capture(None).unwrap();
                    a.memset_async(1, 1024, Some(&s)).unwrap();
                    b.copy_from_device_async(&a, 1024, Some(&s)).unwrap();
                    let graph = s.end_capture().unwrap();
                    let dot = graph.debug_dot_str(0).unwrap();
                    assert!(dot.trim_start().starts_with("digraph"), "{dot}");
                    let lower = dot.to_lowercase();
                    assert!(lower.contains("memset") && lower.contains("memcpy"), "both operations are named:\n{dot}");
                    assert!(dot.contains("->"), "the copy depends on the memset:\n{dot}");
                    graph.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert!(read(&b, 1024).iter().all(|&x| x == 1));
                }
            }
        }
    };
}
