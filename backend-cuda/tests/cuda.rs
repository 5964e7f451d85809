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
    get_elapsed_time, Device, DeviceOps, Error, Event, ExternalStream, MemoryOps, MemoryPool, Stream,
};
use gpumem_cuda::Cuda;

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

/// A stream created with the raw driver API, wrapped as an `ExternalStream`: the handle is the
/// driver's own, and the conformance body (asynchronous memsets and copies on it, and the stream
/// still valid after the wrapper is dropped) holds for it.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn external_stream_from_raw_driver_handle() {
    require_gpu();
    // Make device 0's primary context current, so the raw stream is created in it.
    Device::<Cuda>::new(0).use_device().expect("use device 0");
    let mut raw: CUstream = std::ptr::null_mut();
    // SAFETY: device 0's primary context is current on this thread; `raw` is a valid out-pointer.
    let r = unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
    assert_eq!(r as u32, 0, "cuStreamCreate");
    assert!(!raw.is_null());
    {
        // SAFETY: `raw` is a live stream of device 0, destroyed only at the end of this test.
        let ext = unsafe { ExternalStream::<Cuda>::from_ptr(raw.addr(), Some(0)) };
        assert_eq!(ext.handle().as_raw().cast::<sys::CUstream_st>(), raw);
    }
    // SAFETY: `raw` stays a live stream of device 0 until it is destroyed below; querying it is
    // sound while it lives.
    unsafe {
        gpumem_conformance::backend::external_stream_from_a_foreign_handle::<Cuda>(raw.addr(), || {
            sys::cuStreamQuery(raw) as u32 == 0
        });
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

/// What is NVIDIA's own in the device's properties (the backend's other operations are the
/// conformance suite's `backend_operations_on_one_device`): a compute capability of 5.0 or more,
/// the oldest this backend's driver API calls support.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn device_properties_are_an_nvidia_gpus() {
    require_gpu();
    let props = Device::<Cuda>::new(0).properties().expect("properties");
    assert!(props.compute_capability.0 >= 5, "{:?}", props.compute_capability);
    assert!(props.unified_addressing && props.multiprocessor_count > 0, "{props:?}");
}

/// Serialises the test that captures with any other that synchronises the whole device: CUDA
/// refuses a device-wide synchronisation while any stream captures, and tests run in parallel.
fn capture_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
