//! The CUDA backend through gpumem's typed API.
//!
//! `driver_presence_decides_every_answer` runs everywhere: without libcuda every call must be
//! `DriverNotFound` (and nothing may panic); with it, calls must succeed or report `NoDevice`.
//!
//! The other tests need an NVIDIA GPU. They are ignored by default, so they show as skipped on
//! machines without one; run them with `cargo test -p gpumem-cuda -- --include-ignored`. When run,
//! a missing device is a failure, never a pass. What every backend does (two devices included) is
//! in the conformance suite (`tests/conformance.rs`); this file keeps what is this backend's own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUstream};
use gpumem_core::{
    get_elapsed_time, CaptureStatus, Device, DeviceOps, Error, Event, ExternalStream, GraphOps, Memory,
    MemoryOps, MemoryPointer, MemoryPool, PinnedMemoryPointer, Stream, StreamOps,
};
use gpumem_cuda::{Cuda, CudaStream};

mod support;
use support::{device_required, read_back, require_gpu};

#[test]
fn driver_presence_decides_every_answer() {
    // SAFETY: `is_culib_present` only tries to load the driver library and closes it again.
    let present = unsafe { sys::is_culib_present() };
    assert_eq!(present, gpumem_cuda::driver_library_present());

    if present {
        // A driver is installed: the answer is a real count, or "no device".
        match Cuda::device_count() {
            Ok(n) => assert!(n >= 1, "a device count of 0 must be reported as NoDevice"),
            Err(Error::NoDevice { backend: "cuda" }) => {
                assert!(!device_required(), "GPUMEM_REQUIRE_DEVICE=1, but the driver reports no device");
            }
            Err(e) => panic!("libcuda is present, yet device_count failed: {e}"),
        }
        return;
    }

    // No driver: every operation reports DriverNotFound, none panics.
    assert!(!device_required(), "GPUMEM_REQUIRE_DEVICE=1, but libcuda cannot be loaded");
    match Cuda::device_count() {
        Err(Error::DriverNotFound { backend: "cuda", detail }) => {
            assert!(detail.contains("libcuda"), "{detail}");
        }
        other => panic!("expected DriverNotFound, got {other:?}"),
    }
    gpumem_conformance::no_device::every_call_is_refused::<Cuda>(|e| {
        matches!(e, Error::DriverNotFound { backend: "cuda", .. })
    });
}

/// A graph captured on a non-blocking stream (memsets, a device-to-device copy and a host
/// function), replayed several times, with the memory and the host function's count checked
/// after each replay.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn captured_graph_replays_memsets_copies_and_host_functions() {
    require_gpu();
    let _serial = capture_lock();
    const N: usize = 1 << 16;
    const HALF: usize = N / 2;
    let pool = MemoryPool::<Cuda>::new();
    let a = pool.malloc(N).expect("malloc a");
    let b = pool.malloc(N).expect("malloc b");
    let s = Stream::<Cuda>::non_blocking().expect("stream");
    let calls = Arc::new(AtomicUsize::new(0));

    assert!(!s.is_capturing().expect("capture status before"));
    s.begin_capture(None).expect("begin_capture");
    assert!(s.is_capturing().expect("capture status during"));
    a.memset_async(1, N, Some(&s)).expect("memset a");
    b.copy_from_device_async(&a, N, Some(&s)).expect("copy a to b");
    (&a + HALF as isize).memset_async(2, HALF, Some(&s)).expect("memset upper half of a");
    {
        let calls = Arc::clone(&calls);
        s.launch_host_func(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        })
        .expect("launch_host_func while capturing");
    }
    let graph = s.end_capture().expect("end_capture");
    assert!(!s.is_capturing().expect("capture status after"));
    // Capturing ran nothing.
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    graph.upload(Some(&s)).expect("upload");

    for launch in 1..=5 {
        a.memset(0, N).expect("clear a");
        b.memset(0, N).expect("clear b");
        graph.launch(Some(&s)).expect("launch");
        s.synchronize().expect("synchronize");
        let a_host = read_back(&a, N);
        let b_host = read_back(&b, N);
        assert!(a_host[..HALF].iter().all(|&x| x == 1), "launch {launch}: lower half of a");
        assert!(a_host[HALF..].iter().all(|&x| x == 2), "launch {launch}: upper half of a");
        assert!(b_host.iter().all(|&x| x == 1), "launch {launch}: b");
        assert_eq!(calls.load(Ordering::SeqCst), launch, "host function calls after launch {launch}");
    }
    drop(graph);
    // The graph owned the only other reference to the host function.
    assert_eq!(Arc::strong_count(&calls), 1);
}

/// A stream created with the raw driver API, wrapped as an `ExternalStream`, used for gpumem's
/// asynchronous memsets and copies, and still valid after the wrapper is dropped.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn external_stream_from_raw_driver_handle() {
    require_gpu();
    const N: usize = 4096;
    // Make device 0's primary context current, so the raw stream is created in it.
    Device::<Cuda>::new(0).use_device().expect("use device 0");
    let mut raw: CUstream = std::ptr::null_mut();
    // SAFETY: device 0's primary context is current on this thread; `raw` is a valid out-pointer.
    let r = unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
    assert_eq!(r as u32, 0, "cuStreamCreate");
    assert!(!raw.is_null());

    let src = MemoryPointer::from_memory(Memory::<Cuda>::new(N).expect("malloc src"));
    let dst = MemoryPointer::from_memory(Memory::<Cuda>::new(N).expect("malloc dst"));
    {
        // SAFETY: `raw` is a live stream of device 0, destroyed only at the end of this test.
        let ext = unsafe { ExternalStream::<Cuda>::from_ptr(raw.addr(), Some(0)) };
        assert_eq!(ext.ptr(), raw.addr());
        assert_eq!(ext.handle().as_raw().cast::<sys::CUstream_st>(), raw);
        assert!(!ext.is_owned());
        assert!(ext.is_non_blocking().expect("flags"));
        let s: &Stream<Cuda> = &ext;
        src.memset_async(7, N, Some(s)).expect("memset_async");
        dst.copy_from_device_async(&src, N, Some(s)).expect("copy_from_device_async");
        let done = Event::<Cuda>::new().expect("event");
        done.record(Some(s)).expect("record");
        done.synchronize().expect("event synchronize");
        ext.synchronize().expect("stream synchronize");
        assert!(ext.done());
        assert!(read_back(&dst, N).iter().all(|&x| x == 7));
    }
    // Dropping the wrapper left the stream alive: the driver still knows it, and gpumem can use
    // it again.
    // SAFETY: `raw` is still a live stream.
    assert_eq!(unsafe { sys::cuStreamQuery(raw) } as u32, 0, "cuStreamQuery");
    {
        // SAFETY: as above.
        let again = unsafe { ExternalStream::<Cuda>::from_ptr(raw.addr(), Some(0)) };
        dst.memset_async(9, N, Some(&*again)).expect("memset_async again");
        again.synchronize().expect("synchronize again");
        assert!(read_back(&dst, N).iter().all(|&x| x == 9));
    }
    // SAFETY: the test created `raw` and nothing uses it any more; destroyed once.
    assert_eq!(unsafe { sys::cuStreamDestroy_v2(raw) } as u32, 0, "cuStreamDestroy_v2");
}

/// Driver errors carry the entry point, the code, and the driver's name and text for it.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn driver_errors_are_mapped_with_name_code_and_text() {
    require_gpu();
    // Timing between two events never recorded: CUDA_ERROR_INVALID_HANDLE.
    let start = Event::<Cuda>::new().expect("event");
    let end = Event::<Cuda>::new().expect("event");
    match get_elapsed_time(&start, &end) {
        Err(Error::Backend { backend, api, code, name, message }) => {
            assert_eq!((backend, api), ("cuda", "cuEventElapsedTime"));
            assert_eq!((code, name.as_str()), (400, "CUDA_ERROR_INVALID_HANDLE"));
            assert!(!message.is_empty());
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // A device ordinal the driver does not know: CUDA_ERROR_INVALID_DEVICE, in the driver's words.
    match Cuda::malloc(9999, 256) {
        Err(Error::Backend { backend, api, code, name, message }) => {
            assert_eq!((backend, api), ("cuda", "cuDeviceGet"));
            assert_eq!((code, name.as_str()), (101, "CUDA_ERROR_INVALID_DEVICE"));
            assert!(!message.is_empty());
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// The rest of the backend once each: properties, memory information, pointer queries, pinned
/// and stream-ordered memory, stream attributes, callbacks, events and capture status.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn backend_operations_on_one_gpu() {
    require_gpu();
    let _serial = capture_lock();
    let device = Device::<Cuda>::new(0);
    let props = device.properties().expect("properties");
    assert!(!props.name.is_empty());
    assert!(props.total_memory > 0 && props.multiprocessor_count > 0);
    assert!(props.compute_capability.0 >= 5, "{:?}", props.compute_capability);
    assert!(props.unified_addressing);
    let info = device.mem_info().expect("mem_info");
    assert!(info.total > 0 && info.free <= info.total, "{info:?}");
    device.synchronize().expect("device synchronize");

    // Pointer queries: device memory, pinned host memory, pageable host memory.
    let mem = MemoryPointer::from_memory(Memory::<Cuda>::new(4096).expect("malloc"));
    assert_eq!(Cuda::pointer_device(mem.ptr() + 100).expect("device pointer"), Some(0));
    let pinned = PinnedMemoryPointer::<Cuda>::alloc(4096).expect("pinned");
    assert_eq!(Cuda::pointer_device(pinned.ptr().addr()).expect("pinned pointer"), None);
    let pageable = [0u8; 64];
    assert_eq!(Cuda::pointer_device(pageable.as_ptr().addr()).expect("pageable pointer"), None);

    // Pinned round trip on a stream.
    let s = Stream::<Cuda>::non_blocking().expect("stream");
    pinned.write(&[5u8; 4096]).expect("pinned write");
    mem.copy_from_host_async(&pinned, 4096, Some(&s)).expect("h2d async");
    let back = PinnedMemoryPointer::<Cuda>::alloc(4096).expect("pinned");
    mem.copy_to_host_async(&back, 4096, Some(&s)).expect("d2h async");
    s.synchronize().expect("synchronize");
    let mut out = vec![0u8; 4096];
    back.read(&mut out).expect("pinned read");
    assert!(out.iter().all(|&x| x == 5));

    // Stream attributes.
    let (least, greatest) = Cuda::stream_priority_range(0).expect("priority range");
    assert!(least >= greatest);
    assert!(s.is_non_blocking().expect("flags"));
    assert!(!Stream::<Cuda>::new().expect("blocking stream").is_non_blocking().expect("flags"));
    assert_eq!(s.priority().expect("priority"), 0);
    assert_eq!(
        // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
        unsafe { Cuda::capture_status(0, CudaStream::LEGACY) }.expect("legacy capture status"),
        CaptureStatus::None
    );

    // The stream-ordered allocator (the release threshold is raised on first use).
    if props.memory_pools_supported {
        let handle = s.handle();
        // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
        let p = unsafe { Cuda::malloc_async(0, 1 << 20, handle) }.expect("malloc_async");
        // SAFETY: `p` is 1 MiB of stream-ordered memory, used and freed in order on `s`.
        unsafe {
            Cuda::memset_async(0, p, 4, 1 << 20, handle).expect("memset_async");
            Cuda::free_async(0, p, handle).expect("free_async");
        }
        s.synchronize().expect("synchronize");
    } else {
        // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
        assert!(matches!(unsafe { Cuda::malloc_async(0, 1024, s.handle()) }, Err(Error::Unsupported { .. })));
    }

    // A callback runs once, with the stream and an Ok status.
    let seen = Arc::new(AtomicUsize::new(0));
    {
        let seen = Arc::clone(&seen);
        let ptr = s.ptr();
        s.add_callback(move |stream, status| {
            assert_eq!(stream.ptr(), ptr);
            assert!(status.is_ok());
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .expect("add_callback");
    }
    s.synchronize().expect("synchronize after callback");
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    // Events: timing and queries.
    let start = Event::<Cuda>::new().expect("event");
    let end = Event::<Cuda>::new().expect("event");
    start.record(Some(&s)).expect("record start");
    mem.memset_async(1, 4096, Some(&s)).expect("memset_async");
    end.record(Some(&s)).expect("record end");
    end.synchronize().expect("event synchronize");
    assert!(start.done() && end.done());
    let ms = get_elapsed_time(&start, &end).expect("elapsed time");
    assert!(ms >= 0.0, "{ms}");
    let other = Stream::<Cuda>::non_blocking().expect("stream");
    other.wait_event(&end).expect("wait_event");
    other.synchronize().expect("synchronize");
}

/// Serialises the test that captures with the test that synchronises the whole device: CUDA refuses
/// a device-wide synchronisation while any stream captures, and tests run in parallel.
fn capture_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
