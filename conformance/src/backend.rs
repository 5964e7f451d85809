//! The backend contract called directly, once each: device properties, pointer queries, stream
//! attributes, the stream-ordered allocator, the capture status of the legacy stream, and the
//! typed layer's pinned round trip, callbacks, host functions and events over them.

/// The `backend` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __backend_tests {
    ($flavor:ident) => {
        mod backend {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::{Arc, Mutex};

            use gpumem::core::{Api, CaptureStatus, DeviceOps, GraphOps, MemoryOps, StreamOps};
            use gpumem::{Device, Error, Event, Memory, MemoryPointer, PinnedMemoryPointer, Stream, StreamOptions};

            type B = gpumem::DefaultBackend;

            conformance! {
                fn backend_operations_on_one_device() {
                    // The device's stream-ordered pool is shared with the tests that check its
                    // statistics, so not while they run (taken before the capture lock, in the
                    // order the stream-ordered capture test takes both).
                    let _async = $crate::async_pool_lock();
                    let _serial = $crate::capture_lock();
                    let device = Device::new(0);
                    let props = device.properties().unwrap();
                    assert!(!props.name.is_empty());
                    assert!(props.total_memory > 0 && props.multiprocessor_count > 0, "{props:?}");
                    assert!(props.unified_addressing);
                    let info = device.mem_info().unwrap();
                    assert!(info.total > 0 && info.free <= info.total, "{info:?}");
                    device.synchronize().unwrap();

                    // Pointer queries: device memory (inside it, too), pinned host memory and
                    // pageable host memory; neither host kind belongs to a device.
                    let mem = MemoryPointer::from_memory(Memory::new(4096).unwrap());
                    assert_eq!(B::pointer_device(mem.ptr() + 100).unwrap(), Some(0));
                    let pinned = PinnedMemoryPointer::alloc(4096).unwrap();
                    assert_eq!(B::pointer_device(pinned.ptr().addr()).unwrap(), None);
                    let pageable = [0u8; 64];
                    assert_eq!(B::pointer_device(pageable.as_ptr().addr()).unwrap(), None);

                    // A pinned round trip on a stream.
                    let s = Stream::non_blocking().unwrap();
                    pinned.write(&[5u8; 4096]).unwrap();
                    mem.copy_from_host_async(&pinned, 4096, Some(&s)).unwrap();
                    let back = PinnedMemoryPointer::alloc(4096).unwrap();
                    mem.copy_to_host_async(&back, 4096, Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    let mut out = vec![0u8; 4096];
                    back.read(&mut out).unwrap();
                    assert!(out.iter().all(|&x| x == 5));

                    // Stream attributes: the range's greatest priority is the numerically least,
                    // and a stream gets the default priority 0 or the one asked for.
                    let (least, greatest) = B::stream_priority_range(0).unwrap();
                    assert!(least >= greatest, "({least}, {greatest})");
                    assert!(s.is_non_blocking().unwrap());
                    assert!(!Stream::new().unwrap().is_non_blocking().unwrap());
                    assert_eq!(s.priority().unwrap(), 0);
                    let urgent =
                        Stream::with_options(StreamOptions { non_blocking: true, priority: Some(greatest) }).unwrap();
                    assert_eq!(urgent.priority().unwrap(), greatest);

                    // The legacy stream's capture status: not capturing, or capture unsupported.
                    // SAFETY: the legacy stream is one of the special handles, valid on device 0.
                    let status = unsafe { B::capture_status(0, B::legacy_stream()) };
                    if B::CAPS.capture {
                        assert_eq!(status.unwrap(), CaptureStatus::None);
                    } else {
                        assert!(matches!(status, Err(Error::Unsupported { operation: "capture_status", .. })), "{status:?}");
                    }

                    // The stream-ordered allocator, through the contract.
                    let handle = s.handle();
                    if B::CAPS.stream_ordered_allocation && props.memory_pools_supported {
                        // SAFETY: `handle` is `s`'s, a live stream of device 0.
                        let p = unsafe { B::malloc_async(0, 1 << 20, handle) }.unwrap();
                        // SAFETY: `p` is 1 MiB of stream-ordered memory, used and freed in order on `s`.
                        unsafe {
                            B::memset_async(0, p, 4, 1 << 20, handle).unwrap();
                            B::free_async(0, p, handle).unwrap();
                        }
                        s.synchronize().unwrap();
                    } else {
                        // SAFETY: as above; nothing is allocated.
                        let refused = unsafe { B::malloc_async(0, 1024, handle) };
                        assert!(matches!(refused, Err(Error::Unsupported { operation: "malloc_async", .. })), "{refused:?}");
                    }

                    // A callback runs once, with its stream and an Ok status; host functions run
                    // once each, in order, and are freed after their run.
                    let seen = Arc::new(AtomicUsize::new(0));
                    {
                        let seen = Arc::clone(&seen);
                        let ptr = s.ptr();
                        s.add_callback(move |stream, status| {
                            assert_eq!(stream.ptr(), ptr);
                            assert!(status.is_ok());
                            seen.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    }
                    s.synchronize().unwrap();
                    assert_eq!(seen.load(Ordering::SeqCst), 1);
                    let order = Arc::new(Mutex::new(Vec::new()));
                    for i in 0..100 {
                        let order = Arc::clone(&order);
                        s.launch_host_func(move || order.lock().unwrap().push(i)).unwrap();
                    }
                    s.synchronize().unwrap();
                    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
                    assert_eq!(Arc::strong_count(&order), 1, "each host function was freed after its one run");

                    // Events: timing, queries, and a wait on another stream.
                    let start = Event::new().unwrap();
                    let end = Event::new().unwrap();
                    start.record(Some(&s)).unwrap();
                    mem.memset_async(1, 4096, Some(&s)).unwrap();
                    end.record(Some(&s)).unwrap();
                    end.synchronize().unwrap();
                    assert!(start.done() && end.done());
                    let ms = gpumem::get_elapsed_time(&start, &end).unwrap();
                    assert!(ms >= 0.0, "{ms}");
                    let other = Stream::non_blocking().unwrap();
                    other.wait_event(&end).unwrap();
                    other.synchronize().unwrap();
                    assert!($crate::read(&mem, 4096).iter().all(|&x| x == 1));
                }

                fn external_stream_from_a_foreign_handle() {
                    // Here the "foreign" stream is one gpumem made and let go of; the backends'
                    // own tests pass one made with their runtime's API.
                    let handle = Stream::non_blocking().unwrap().into_raw().expect("sole owner");
                    // SAFETY: `handle` is live until `from_raw` below takes it back; querying a
                    // live stream of device 0 is sound.
                    unsafe {
                        $crate::backend::external_stream_from_a_foreign_handle::<B>(B::stream_to_raw(handle), || {
                            B::stream_query(0, handle).is_ok()
                        });
                    }
                    // SAFETY: `handle` came from `into_raw` and is owned again here, destroyed once.
                    drop(unsafe { Stream::from_raw(handle, 0) });
                }
            }
        }
    };
}

/// Wraps `raw`, a live non-blocking stream of device 0 that the backend's own API created, as an
/// `ExternalStream`; runs memsets, a copy and an event on it; and checks that dropping the
/// wrapper left the stream alive (`is_alive` asks the backend's API) and usable by a second
/// wrapper. The caller destroys `raw` afterwards.
///
/// # Safety
///
/// `raw` must be a live stream of device 0 of backend `B`, and stay live until this returns.
///
/// # Panics
///
/// When a step fails: this is a test body.
pub unsafe fn external_stream_from_a_foreign_handle<B: gpumem_core::Runtime>(
    raw: usize,
    is_alive: impl Fn() -> bool,
) {
    use gpumem_core::{Event, ExternalStream, Memory, MemoryPointer, Stream};
    const N: usize = 4096;
    let src = MemoryPointer::from_memory(Memory::<B>::new(N).expect("malloc src"));
    let dst = MemoryPointer::from_memory(Memory::<B>::new(N).expect("malloc dst"));
    {
        // SAFETY: the caller keeps `raw` a live stream of device 0 until this returns.
        let ext = unsafe { ExternalStream::<B>::from_ptr(raw, Some(0)) };
        assert_eq!(ext.ptr(), raw);
        assert!(!ext.is_owned());
        assert!(ext.is_non_blocking().expect("flags"));
        let s: &Stream<B> = &ext;
        src.memset_async(7, N, Some(s)).expect("memset_async");
        dst.copy_from_device_async(&src, N, Some(s)).expect("copy_from_device_async");
        let done = Event::<B>::new().expect("event");
        done.record(Some(s)).expect("record");
        done.synchronize().expect("event synchronize");
        ext.synchronize().expect("stream synchronize");
        assert!(ext.done());
        assert!(crate::read(&dst, N).iter().all(|&x| x == 7));
    }
    // Dropping the wrapper left the stream alive: the backend still knows it, and gpumem can use
    // it again.
    assert!(is_alive(), "the stream outlives its wrapper");
    {
        // SAFETY: as above.
        let again = unsafe { ExternalStream::<B>::from_ptr(raw, Some(0)) };
        dst.memset_async(9, N, Some(&*again)).expect("memset_async again");
        again.synchronize().expect("synchronize again");
        assert!(crate::read(&dst, N).iter().all(|&x| x == 9));
    }
    assert!(is_alive(), "the stream outlives its second wrapper");
}
