//! The HIP backend against the HIP runtime.
//!
//! The first tests run on every machine with the runtime library installed. Without an AMD GPU
//! they check what the runtime answers there (no device, for every operation) and that capture
//! is refused without reaching the runtime; with one, they check the other branch, so they never
//! pass without asserting something.
//!
//! The tests that need a GPU are ignored with the reason; run them with `--include-ignored` on a
//! machine with an AMD GPU. Run without one, they fail rather than skip: each starts with
//! [`require_device`].

use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpumem_core::{
    get_elapsed_time, Backend, CaptureMode, Device, Error, Event, EventFlags, ExternalStream, Memory,
    MemoryPointer, MemoryPool, PinnedMemoryPointer, Stream, StreamFlags, StreamOptions,
};
use gpumem_hip::{Hip, HipGraph, HipStream};
use hip_sys::hiprt::hipStream_t;

/// `hipErrorInvalidDevice`.
const HIP_ERROR_INVALID_DEVICE: i64 = 101;

/// Whether this machine should have a usable AMD GPU: ROCm's kernel driver exposes `/dev/kfd`
/// wherever one is present, and the HIP runtime finds no device without it.
/// (`GPUMEM_REQUIRE_DEVICE` is not read here: the GPU runner sets it on NVIDIA machines, where
/// the HIP runtime rightly finds no device.)
fn amd_gpu_expected() -> bool {
    Path::new("/dev/kfd").exists()
}

/// The number of AMD GPUs; fails the test when there is none.
fn require_device() -> usize {
    match Hip::device_count() {
        Ok(n) => n,
        Err(e) => panic!("this test needs an AMD GPU, and the HIP runtime found none: {e}"),
    }
}

// ---- tests that run everywhere -------------------------------------------------------------------

#[test]
fn device_count_matches_the_machine() {
    match (amd_gpu_expected(), Hip::device_count()) {
        (false, Err(Error::NoDevice { backend: "hip" })) => {}
        (true, Ok(n)) => assert!(n >= 1, "a device count of 0 must be NoDevice, not Ok(0)"),
        (expected, got) => panic!("/dev/kfd present: {expected}; device_count gave {got:?}"),
    }
    // The answer is the same on every call (the runtime is asked once).
    assert_eq!(format!("{:?}", Hip::device_count()), format!("{:?}", Hip::device_count()));
}

#[test]
fn operations_on_a_missing_device_fail_cleanly() {
    // Without a GPU every operation answers NoDevice; with one, an ordinal past the last device
    // gets the runtime's own error from the device switch. Nothing panics either way.
    let (dev, expect): (i32, fn(&Error) -> bool) = match Hip::device_count() {
        Err(_) => (0, |e| matches!(e, Error::NoDevice { backend: "hip" })),
        Ok(n) => (i32::try_from(n).expect("device count fits an i32"), |e| {
            matches!(e, Error::Backend { api: "hipSetDevice", code: HIP_ERROR_INVALID_DEVICE, .. })
        }),
    };
    let check = |what: &str, e: Error| assert!(expect(&e), "{what}: unexpected {e:?}");

    check("set_device", Hip::set_device(dev).unwrap_err());
    check("device_properties", Hip::device_properties(dev).unwrap_err());
    check("mem_get_info", Hip::mem_get_info(dev).unwrap_err());
    check("device_synchronize", Hip::device_synchronize(dev).unwrap_err());
    check("enable_peer_access", Hip::enable_peer_access(dev, 0).unwrap_err());
    check("malloc", Hip::malloc(dev, 1024).unwrap_err());
    check("malloc_host", Hip::malloc_host(dev, 1024).unwrap_err());
    check("malloc_async", Hip::malloc_async(dev, 1024, HipStream::NULL).unwrap_err());
    check("stream_priority_range", Hip::stream_priority_range(dev).unwrap_err());
    check("stream_create", Hip::stream_create(dev, StreamFlags::default(), 0).unwrap_err());
    check("stream_flags", Hip::stream_flags(dev, HipStream::PER_THREAD).unwrap_err());
    check("stream_priority", Hip::stream_priority(dev, HipStream::NULL).unwrap_err());
    check("stream_query", Hip::stream_query(dev, HipStream::NULL).unwrap_err());
    check("stream_synchronize", Hip::stream_synchronize(dev, HipStream::NULL).unwrap_err());
    check("event_create", Hip::event_create(dev, EventFlags::default()).unwrap_err());

    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let refused =
        Hip::add_callback(dev, HipStream::NULL, Box::new(move |_| flag.store(true, Ordering::SeqCst)));
    check("add_callback", refused.unwrap_err());
    unsafe extern "C" fn never(_: *mut c_void) {}
    // SAFETY: `never` does not unwind and ignores its argument.
    check(
        "launch_host_func",
        unsafe { Hip::launch_host_func(dev, HipStream::NULL, never, std::ptr::null_mut()) }.unwrap_err(),
    );
    assert!(!ran.load(Ordering::SeqCst), "a refused callback must be dropped without running");

    if Hip::device_count().is_err() {
        // Operations that take no device to switch to give NoDevice too.
        let host = [0u8; 16];
        check("pointer_device", Hip::pointer_device(host.as_ptr() as usize).unwrap_err());
        check("can_access_peer", Hip::can_access_peer(0, 1).unwrap_err());
        // And so does the typed layer on top.
        check("Memory::new", Memory::<Hip>::new(1024).unwrap_err());
        check("MemoryPool::malloc", MemoryPool::<Hip>::new().malloc(1024).unwrap_err());
        check("Stream::new", Stream::<Hip>::new().unwrap_err());
        check("Event::new", Event::<Hip>::new().unwrap_err());
    }
}

#[test]
fn capture_operations_are_unsupported() {
    let unsupported = |op: &'static str, e: Error| match e {
        Error::Unsupported { operation, backend: "hip" } if operation == op => {}
        other => panic!("{op}: expected Unsupported, got {other:?}"),
    };
    // Any device and any stream: the runtime is never asked, so these hold with or without a GPU.
    for (dev, stream) in [(0, HipStream::PER_THREAD), (7, HipStream::NULL)] {
        unsupported("begin_capture", Hip::begin_capture(dev, stream, CaptureMode::Relaxed).unwrap_err());
        unsupported("begin_capture", Hip::begin_capture(dev, stream, CaptureMode::Global).unwrap_err());
        unsupported("end_capture", Hip::end_capture(dev, stream).unwrap_err());
        unsupported("capture_status", Hip::capture_status(dev, stream).unwrap_err());
    }
    // `graph_launch`, `graph_upload` and `graph_destroy` need a `HipGraph`, and there is none:
    // this function type-checks only because `HipGraph` has no values.
    fn no_graph_exists(graph: HipGraph) -> ! {
        match graph {}
    }
    let _: fn(HipGraph) -> ! = no_graph_exists;

    // The typed layer passes the answers on, and refuses the default streams itself first.
    let ptds = Stream::<Hip>::per_thread();
    unsupported("begin_capture", ptds.begin_capture(None).unwrap_err());
    unsupported("end_capture", ptds.end_capture().unwrap_err());
    unsupported("capture_status", ptds.is_capturing().unwrap_err());
    assert!(matches!(Stream::<Hip>::null().begin_capture(None), Err(Error::InvalidArgument(_))));
    assert!(matches!(Stream::<Hip>::legacy().begin_capture(None), Err(Error::InvalidArgument(_))));
}

#[test]
fn stream_handles_keep_their_raw_values() {
    assert_eq!(Hip::stream_to_raw(Hip::null_stream()), 0);
    assert_eq!(Hip::stream_to_raw(Hip::per_thread_stream()), 2);
    // HIP 5.2 has no legacy handle: the legacy stream is the null stream.
    assert_eq!(Hip::legacy_stream(), Hip::null_stream());
    assert_eq!(Stream::<Hip>::legacy(), Stream::<Hip>::null());
    // SAFETY: 0, 1 and 2 are the special handles; the others are only converted, never used.
    unsafe {
        assert_eq!(Hip::stream_from_raw(0), HipStream::NULL);
        assert_eq!(Hip::stream_from_raw(1), HipStream::LEGACY);
        assert_eq!(Hip::stream_from_raw(2), HipStream::PER_THREAD);
        for raw in [0x7f00_1234_5000usize, usize::MAX] {
            assert_eq!(Hip::stream_to_raw(Hip::stream_from_raw(raw)), raw);
        }
    }
}

// ---- tests that need an AMD GPU ------------------------------------------------------------------

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn device_properties_describe_the_gpu() {
    require_device();
    let props = Hip::device_properties(0).unwrap();
    assert!(!props.name.is_empty());
    assert!(props.total_memory > 0);
    assert!(props.multiprocessor_count > 0);
    assert!(props.compute_capability.0 > 0, "gfx architecture major: {:?}", props.compute_capability);
    assert!(props.unified_addressing);
    let info = Hip::mem_get_info(0).unwrap();
    assert!(info.total > 0 && info.free <= info.total);
    assert_eq!(Device::<Hip>::new(0).properties().unwrap(), props);
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn copies_and_memsets_round_trip() {
    require_device();
    let pool = MemoryPool::<Hip>::new();
    let a = pool.malloc(1000).unwrap();
    let b = pool.malloc(1000).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    a.copy_from_host(&data, 1000).unwrap();
    b.copy_from_device(&a, 1000).unwrap();
    let mut back = vec![0u8; 1000];
    b.copy_to_host(&mut back, 1000).unwrap();
    assert_eq!(back, data);

    // memset, then each byte back through an offset pointer (CuPy's test).
    b.memset(1, 4).unwrap();
    for i in 0..4 {
        let mut one = [0u8; 1];
        (&b + i).copy_to_host(&mut one, 1).unwrap();
        assert_eq!(one[0], 1);
    }
    let mut fifth = [0u8; 1];
    (&b + 4).copy_to_host(&mut fifth, 1).unwrap();
    assert_eq!(fifth[0], data[4]);

    // Out of bounds is refused before the runtime sees it.
    assert!(matches!(a.copy_to_host(&mut back, 1025), Err(Error::OutOfBounds { .. })));
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn async_copies_and_memsets_on_streams() {
    require_device();
    let n = 1 << 20;
    let dev = MemoryPointer::from_memory(Memory::<Hip>::new(n).unwrap());
    let other = MemoryPointer::from_memory(Memory::<Hip>::new(n).unwrap());
    let pinned = PinnedMemoryPointer::<Hip>::alloc(n).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 256) as u8).collect();
    pinned.write(&data).unwrap();
    for stream in [Some(Stream::<Hip>::new().unwrap()), Some(Stream::<Hip>::non_blocking().unwrap()), None] {
        dev.memset_async(0, n, stream.as_ref()).unwrap();
        dev.copy_from_host_async(&pinned, n, stream.as_ref()).unwrap();
        other.copy_from_device_async(&dev, n, stream.as_ref()).unwrap();
        (&other + 10).memset_async(9, 10, stream.as_ref()).unwrap();
        let back = PinnedMemoryPointer::<Hip>::alloc(n).unwrap();
        other.copy_to_host_async(&back, n, stream.as_ref()).unwrap();
        match &stream {
            Some(s) => s.synchronize().unwrap(),
            None => Stream::<Hip>::current().synchronize().unwrap(),
        }
        let mut out = vec![0u8; n];
        back.read(&mut out).unwrap();
        assert_eq!(&out[..10], &data[..10]);
        assert!(out[10..20].iter().all(|&b| b == 9));
        assert_eq!(&out[20..], &data[20..]);
    }
    // The per-thread default stream works as a stream of its own.
    let ptds = Stream::<Hip>::per_thread();
    dev.memset_async(3, n, Some(&ptds)).unwrap();
    ptds.synchronize().unwrap();
    let mut out = vec![0u8; 16];
    dev.copy_to_host(&mut out, 16).unwrap();
    assert!(out.iter().all(|&b| b == 3));
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn stream_properties_and_priorities() {
    require_device();
    let (least, greatest) = Hip::stream_priority_range(0).unwrap();
    assert!(least >= greatest);
    let s =
        Stream::<Hip>::with_options(StreamOptions { non_blocking: true, priority: Some(greatest) }).unwrap();
    assert!(s.is_non_blocking().unwrap());
    assert_eq!(s.priority().unwrap(), greatest);
    let blocking = Stream::<Hip>::new().unwrap();
    assert!(!blocking.is_non_blocking().unwrap());
    // The null stream's flags are answered without asking HIP (which refuses the question).
    assert!(!Stream::<Hip>::null().is_non_blocking().unwrap());
    assert!(blocking.query().unwrap());
    assert!(blocking.done());
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn events_order_and_time_work() {
    require_device();
    let n = 64 << 20;
    let mem = MemoryPointer::from_memory(Memory::<Hip>::new(n).unwrap());
    let a = Stream::<Hip>::non_blocking().unwrap();
    let b = Stream::<Hip>::non_blocking().unwrap();
    let start = a.record(None).unwrap();
    mem.memset_async(5, n, Some(&a)).unwrap();
    let end = a.record(None).unwrap();
    b.wait_event(&end).unwrap();
    let pinned = PinnedMemoryPointer::<Hip>::alloc(16).unwrap();
    (&mem + (n as isize - 16)).copy_to_host_async(&pinned, 16, Some(&b)).unwrap();
    b.synchronize().unwrap();
    let mut out = [0u8; 16];
    pinned.read(&mut out).unwrap();
    assert_eq!(out, [5u8; 16], "b ran its copy only after a's memset");
    end.synchronize().unwrap();
    assert!(end.done());
    let ms = get_elapsed_time(&start, &end).unwrap();
    assert!(ms >= 0.0, "elapsed {ms} ms");

    let untimed =
        Event::<Hip>::with_flags(EventFlags { disable_timing: true, ..EventFlags::default() }).unwrap();
    untimed.record(Some(&a)).unwrap();
    untimed.synchronize().unwrap();
    assert!(matches!(get_elapsed_time(&start, &untimed), Err(Error::Backend { backend: "hip", .. })));
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn callbacks_and_host_functions_run_in_order() {
    require_device();
    let s = Stream::<Hip>::non_blocking().unwrap();
    let out = Arc::new(Mutex::new(Vec::new()));
    for i in 0..100 {
        let out = Arc::clone(&out);
        s.launch_host_func(move || out.lock().unwrap().push(i)).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(*out.lock().unwrap(), (0..100).collect::<Vec<_>>());

    let seen = Arc::new(AtomicUsize::new(0));
    let ptr = s.ptr();
    let count = Arc::clone(&seen);
    s.add_callback(move |stream, status| {
        assert_eq!(stream.ptr(), ptr);
        assert!(status.is_ok());
        count.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    // A panic in a host function is caught and reported at the next synchronize.
    s.launch_host_func(|| panic!("boom")).unwrap();
    assert!(matches!(s.synchronize(), Err(Error::CallbackPanicked(m)) if m.contains("boom")));
}

extern "C" {
    // Declared here with an integer status, as the backend declares its own (see its `result`
    // module); the library is linked through hip-sys.
    fn hipStreamCreate(stream: *mut hipStream_t) -> u32;
    fn hipStreamDestroy(stream: hipStream_t) -> u32;
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn external_stream_from_a_raw_hip_stream() {
    require_device();
    Device::<Hip>::new(0).use_device().unwrap();
    let mut raw: hipStream_t = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { hipStreamCreate(&mut raw) }, 0);
    {
        // SAFETY: `raw` is a live stream of this runtime, destroyed only after this scope.
        let external = unsafe { ExternalStream::<Hip>::new(HipStream::from_raw(raw), Some(0)) };
        assert_eq!(external.ptr(), raw as usize);
        assert!(!external.is_owned());
        let mem = MemoryPointer::from_memory(Memory::<Hip>::new(4096).unwrap());
        mem.memset_async(42, 4096, Some(&external)).unwrap();
        external.synchronize().unwrap();
        let mut out = [0u8; 4096];
        mem.copy_to_host(&mut out, 4096).unwrap();
        assert!(out.iter().all(|&b| b == 42));
        let _guard = external.enter().unwrap();
        assert_eq!(Stream::<Hip>::current(), *external);
    }
    // gpumem did not destroy it: destroying it here succeeds.
    // SAFETY: `raw` is live and destroyed once.
    assert_eq!(unsafe { hipStreamDestroy(raw) }, 0);
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn peer_copy_between_two_gpus() {
    let count = require_device();
    assert!(count >= 2, "this test needs two AMD GPUs; the runtime found {count}");
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 199) as u8).collect();
    let on0 = MemoryPointer::from_memory(Memory::<Hip>::new_on(0, 4096).unwrap());
    let on1 = MemoryPointer::from_memory(Memory::<Hip>::new_on(1, 4096).unwrap());
    on0.copy_from_host(&data, 4096).unwrap();
    on1.copy_from_device(&on0, 4096).unwrap();
    let mut back = vec![0u8; 4096];
    on1.copy_to_host(&mut back, 4096).unwrap();
    assert_eq!(back, data);
    if Hip::can_access_peer(1, 0).unwrap() {
        // Enabled by the copy above; enabling again is success.
        Hip::enable_peer_access(1, 0).unwrap();
        Hip::enable_peer_access(1, 0).unwrap();
    }
    assert_eq!(Hip::pointer_device(on1.ptr()).unwrap(), Some(1));
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn out_of_memory_is_out_of_memory() {
    require_device();
    let too_much = Hip::mem_get_info(0).unwrap().total.saturating_mul(4);
    match Hip::malloc(0, too_much) {
        Err(Error::OutOfMemory { size, total: None }) => assert_eq!(size, too_much),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    match Hip::malloc_host(0, usize::MAX / 4) {
        Err(e) => assert!(e.is_out_of_memory() || matches!(e, Error::Backend { .. }), "{e:?}"),
        Ok(p) => panic!("pinned {p:?} of usize::MAX / 4 bytes"),
    }
    // The pool runs its retry ladder and reports CuPy's message.
    let err = MemoryPool::<Hip>::new().malloc(too_much).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn errors_carry_hip_names() {
    let count = require_device();
    let past = i32::try_from(count).unwrap();
    match Hip::set_device(past) {
        Err(Error::Backend { backend: "hip", api: "hipSetDevice", code, name, .. }) => {
            assert_eq!(code, HIP_ERROR_INVALID_DEVICE);
            assert_eq!(name, "hipErrorInvalidDevice");
        }
        other => panic!("expected hipErrorInvalidDevice, got {other:?}"),
    }
    // The cache was not fooled: device 0 still works.
    Hip::set_device(0).unwrap();
    assert!(Hip::malloc(0, 512).is_ok_and(|p| {
        // SAFETY: `p` was just allocated on device 0 and nothing uses it.
        unsafe { Hip::free(0, p) }.is_ok()
    }));
    // Elapsed time of an event never recorded is the runtime's error, not a panic.
    let (a, b) = (Event::<Hip>::new().unwrap(), Event::<Hip>::new().unwrap());
    assert!(matches!(get_elapsed_time(&a, &b), Err(Error::Backend { backend: "hip", .. })));
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn malloc_async_follows_the_device() {
    require_device();
    let s = Stream::<Hip>::non_blocking().unwrap();
    let supported = Hip::device_properties(0).unwrap().memory_pools_supported;
    match Hip::malloc_async(0, 1 << 20, s.handle()) {
        Ok(p) => {
            assert!(supported, "hipMallocAsync worked where the device reports no memory pools");
            // SAFETY: `p` came from `malloc_async` on this stream and nothing uses it.
            unsafe { Hip::memset_async(0, p, 1, 1 << 20, s.handle()).unwrap() };
            // SAFETY: as above; the memset is ordered before the free on the same stream.
            unsafe { Hip::free_async(0, p, s.handle()).unwrap() };
            s.synchronize().unwrap();
        }
        Err(Error::Unsupported { operation: "malloc_async", backend: "hip" }) => assert!(!supported),
        Err(e) => panic!("malloc_async: {e:?}"),
    }
}

#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn pointer_device_tells_device_from_host_memory() {
    require_device();
    let mem = Memory::<Hip>::new_on(0, 4096).unwrap();
    let device_ptr = MemoryPointer::from_memory(mem);
    assert_eq!(Hip::pointer_device(device_ptr.ptr()).unwrap(), Some(0));
    assert_eq!(Hip::pointer_device((&device_ptr + 100).ptr()).unwrap(), Some(0));
    let host = vec![0u8; 4096];
    assert_eq!(Hip::pointer_device(host.as_ptr() as usize).unwrap(), None);
    let pinned = PinnedMemoryPointer::<Hip>::alloc(4096).unwrap();
    assert_eq!(Hip::pointer_device(pinned.ptr() as usize).unwrap(), None);
}
