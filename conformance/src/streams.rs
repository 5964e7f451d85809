//! Streams: the current stream, guards, callbacks, host functions, external streams.

/// The `streams` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __streams_tests {
    ($flavor:ident) => {
        mod streams {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::{Arc, Mutex};

            use gpumem::{Error, ExternalStream, Stream, StreamOptions};


            conformance! {
                fn default_streams_and_their_values() {
                    assert_eq!(Stream::null().ptr(), 0);
                    assert_eq!(Stream::per_thread().ptr(), 2);
                    assert_eq!(Stream::null(), Stream::null());
                    assert_eq!(Stream::null().device_id(), None);
                    assert_eq!(gpumem::get_current_stream(), Stream::null(), "a thread starts on the default stream");
                    let s = Stream::new().unwrap();
                    assert!(s.is_owned() && s.ptr() > 2);
                    assert_eq!(s.device_id(), Some(gpumem::Device::current().id()));
                    assert_ne!(s, Stream::null());
                    assert!(!s.is_non_blocking().unwrap());
                    assert!(Stream::non_blocking().unwrap().is_non_blocking().unwrap());
                    assert!(format!("{s:?}").starts_with("<Stream "));
                }

                fn priorities_within_the_range_and_refused_outside_it() {
                    let high = Stream::with_options(StreamOptions { non_blocking: false, priority: Some(-1) }).unwrap();
                    assert_eq!(high.priority().unwrap(), -1);
                    let refused = Stream::with_options(StreamOptions { non_blocking: false, priority: Some(1000) });
                    assert!(matches!(refused, Err(Error::PriorityOutOfRange { .. })));
                }

                fn the_guard_restores_the_previous_stream() {
                    let s1 = Stream::new().unwrap();
                    let s2 = Stream::new().unwrap();
                    {
                        let _g1 = s1.enter().unwrap();
                        assert_eq!(gpumem::get_current_stream(), s1);
                        {
                            let _g2 = s2.enter().unwrap();
                            assert_eq!(gpumem::get_current_stream(), s2);
                        }
                        assert_eq!(gpumem::get_current_stream(), s1);
                    }
                    assert_eq!(gpumem::get_current_stream(), Stream::null());
                    // A stream set with use_stream() is what the guard restores (CuPy 14.2 forgets it).
                    s1.use_stream().unwrap();
                    {
                        let _g = s2.enter().unwrap();
                        assert_eq!(gpumem::get_current_stream(), s2);
                    }
                    assert_eq!(gpumem::get_current_stream(), s1);
                    Stream::null().use_stream().unwrap();
                }

                fn a_new_thread_starts_on_the_default_stream() {
                    let s = Stream::new().unwrap();
                    let _g = s.enter().unwrap();
                    let other = std::thread::spawn(|| gpumem::get_current_stream().ptr()).join().unwrap();
                    assert_eq!(other, 0);
                    assert_eq!(gpumem::get_current_stream(), s);
                }

                fn a_hundred_callbacks_run_in_order() {
                    let s = Stream::new().unwrap();
                    let out = Arc::new(Mutex::new(Vec::new()));
                    for i in 0..100 {
                        let out = out.clone();
                        let expected = s.ptr();
                        s.add_callback(move |stream, status| {
                            assert_eq!(stream.ptr(), expected);
                            status.unwrap();
                            out.lock().unwrap().push(i);
                        })
                        .unwrap();
                    }
                    s.synchronize().unwrap();
                    assert_eq!(*out.lock().unwrap(), (0..100).collect::<Vec<_>>());

                    let out = Arc::new(Mutex::new(Vec::new()));
                    for i in 0..100 {
                        let out = out.clone();
                        s.launch_host_func(move || out.lock().unwrap().push(i)).unwrap();
                    }
                    s.synchronize().unwrap();
                    assert_eq!(*out.lock().unwrap(), (0..100).collect::<Vec<_>>());
                }

                fn a_panicking_callback_is_caught_and_reported() {
                    let s = Stream::new().unwrap();
                    let after = Arc::new(AtomicUsize::new(0));
                    s.launch_host_func(|| panic!("boom in a host function")).unwrap();
                    let a = after.clone();
                    s.add_callback(move |_, _| {
                        a.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                    s.add_callback(|_, _| panic!("boom in a callback")).unwrap();
                    let err = s.synchronize().unwrap_err();
                    assert!(matches!(&err, Error::CallbackPanicked(m) if m.contains("boom in a host function")), "{err}");
                    assert_eq!(after.load(Ordering::SeqCst), 1, "the stream went on after the panic");
                    assert!(matches!(s.synchronize(), Err(Error::CallbackPanicked(m)) if m.contains("boom in a callback")));
                    s.synchronize().unwrap();
                    // The stream still works.
                    let p = gpumem::alloc(16).unwrap();
                    p.memset_async(1, 16, Some(&s)).unwrap();
                    s.synchronize().unwrap();
                }

                fn external_stream_never_destroys_its_handle() {
                    let owned = Stream::non_blocking().unwrap();
                    let raw = owned.into_raw().expect("sole owner");
                    let p = gpumem::alloc(64).unwrap();
                    {
                        // SAFETY: `raw` is a live stream until `from_raw` below takes it back.
                        let ext = unsafe { ExternalStream::new(raw, None) };
                        assert!(!ext.is_owned());
                        p.memset_async(4, 64, Some(&ext)).unwrap();
                        ext.synchronize().unwrap();
                        let _g = ext.enter().unwrap();
                        assert_eq!(gpumem::get_current_stream().ptr(), ext.ptr());
                    }
                    // SAFETY: as above; the handle is still live because dropping the wrapper did nothing.
                    let again = unsafe { ExternalStream::from_ptr(<gpumem::DefaultBackend as gpumem::core::StreamOps>::stream_to_raw(raw), None) };
                    p.memset_async(5, 64, Some(&again)).unwrap();
                    again.synchronize().unwrap();
                    assert!(again.done());
                    drop(again);
                    // SAFETY: gpumem owns the handle again and destroys it once.
                    let back = unsafe { Stream::from_raw(raw, gpumem::Device::current().id()) };
                    back.synchronize().unwrap();
                    assert_eq!($crate::read(&p, 64), vec![5u8; 64]);
                }

                fn into_raw_refuses_shared_or_foreign_streams() {
                    let s = Stream::new().unwrap();
                    let clone = s.clone();
                    let s = s.into_raw().expect_err("a clone exists");
                    drop(clone);
                    let raw = s.into_raw().expect("sole owner now");
                    // SAFETY: `raw` came from `into_raw` and is owned again here.
                    drop(unsafe { Stream::from_raw(raw, gpumem::Device::current().id()) });
                    assert!(Stream::null().into_raw().is_err());
                }

                fn done_and_synchronize_on_default_streams() {
                    let p = gpumem::alloc(64).unwrap();
                    for s in [Stream::null(), Stream::per_thread()] {
                        p.memset_async(1, 64, Some(&s)).unwrap();
                        s.synchronize().unwrap();
                        // The null stream's query also covers the blocking streams other tests
                        // run in parallel, so only the answer, not its value, is checked there.
                        if s == Stream::null() {
                            assert!(s.query().is_ok());
                        } else {
                            assert!(s.done());
                        }
                    }
                }
            }
        }
    };
}
