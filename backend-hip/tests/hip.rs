//! The HIP backend through gpumem's typed API.
//!
//! The tests follow `backend-cuda/tests/cuda.rs` one for one, with "driver" read as HIP's
//! runtime; where HIP differs, so does the test, and its comment says how.
//!
//! Three tests run everywhere. `device_presence_decides_every_answer` stands where the CUDA
//! suite's `driver_presence_decides_every_answer` does: without the runtime library every call
//! must be `DriverNotFound`, with it but without a device `NoDevice` (and nothing may panic);
//! with a device, the count must be real.
//! `capture_is_unsupported_without_reaching_the_runtime` stands where the CUDA suite replays a
//! captured graph. `stream_handles_keep_their_raw_values` checks HIP's special stream handles.
//!
//! The other tests need an AMD GPU. They are ignored by default, so they show as skipped on
//! machines without one; run them with `cargo test -p gpumem-hip -- --include-ignored`. When run,
//! a missing device is a failure, never a pass. What every backend does (two devices included) is
//! in the conformance suite (`tests/conformance.rs`); this file keeps what is this backend's own.
//! None of them has run on AMD hardware yet.

use std::path::Path;

use gpumem_core::{
    get_elapsed_time, CaptureMode, Device, DeviceOps, Error, Event, ExternalStream, GraphOps, Memory,
    MemoryOps, Stream, StreamOps,
};
use gpumem_hip::{Hip, HipGraph, HipStream};
use hip_sys::hiprt::{hipStreamNonBlocking, hipStream_t};

/// The three raw runtime calls the external-stream test needs, resolved from the library the
/// backend loaded, with an integer status as the backend declares its own (see its `result`
/// module).
struct RawHip {
    _library: libloading::Library,
    create_with_flags: unsafe extern "C" fn(*mut hipStream_t, u32) -> u32,
    query: unsafe extern "C" fn(hipStream_t) -> u32,
    destroy: unsafe extern "C" fn(hipStream_t) -> u32,
}

impl RawHip {
    fn load() -> RawHip {
        let path = gpumem_hip::runtime_library().expect("the HIP runtime library");
        // SAFETY: the library the backend already loaded (dlopen hands back the same one); its
        // initialisers have run.
        let library = unsafe { libloading::Library::new(path) }.expect("open the HIP runtime again");
        // SAFETY: HIP 5.2's signatures of the three functions, with the status as its integer;
        // the pointers are used only while `_library` keeps the library loaded.
        unsafe {
            RawHip {
                create_with_flags: *library
                    .get(b"hipStreamCreateWithFlags\0")
                    .expect("hipStreamCreateWithFlags"),
                query: *library.get(b"hipStreamQuery\0").expect("hipStreamQuery"),
                destroy: *library.get(b"hipStreamDestroy\0").expect("hipStreamDestroy"),
                _library: library,
            }
        }
    }
}

/// `hipSuccess`.
const HIP_SUCCESS: u32 = 0;

/// Whether this machine should have a usable HIP device: ROCm's kernel driver exposes
/// `/dev/kfd` wherever an AMD GPU is, and the HIP runtime finds no device without it; or
/// `GPUMEM_REQUIRE_DEVICE=1` is set, as the GPU runners set it (`scripts/gpu-hip-tests.sh`
/// runs these tests on an NVIDIA GPU through a HIP-on-CUDA runtime; the CUDA runs leave this
/// crate's tests out).
fn gpu_expected() -> bool {
    Path::new("/dev/kfd").exists() || std::env::var("GPUMEM_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1")
}

/// The number of devices; fails the test when there is no usable GPU.
fn require_gpu() -> usize {
    match Device::<Hip>::count() {
        Ok(n) => n,
        Err(e) => panic!("this test needs an AMD GPU, and the HIP runtime found none: {e}"),
    }
}

#[test]
fn device_presence_decides_every_answer() {
    if gpu_expected() {
        // An AMD GPU is there: the answer is a real count.
        match Hip::device_count() {
            Ok(n) => assert!(n >= 1, "a device count of 0 must be reported as NoDevice"),
            Err(e) => panic!("/dev/kfd is present, yet device_count failed: {e}"),
        }
        // An ordinal past the last device gets the runtime's own error from the device switch.
        let past = i32::try_from(require_gpu()).expect("device count fits an i32");
        assert!(matches!(
            Hip::malloc(past, 1024),
            Err(Error::Backend { backend: "hip", api: "hipSetDevice", code: 101, .. })
        ));
        return;
    }

    // No device. Without the runtime library every operation is DriverNotFound; with it (the
    // runtime answers hipErrorNoDevice without /dev/kfd), NoDevice. Either way none panics, and
    // the answer does not change between calls.
    let library = gpumem_hip::runtime_library().is_ok();
    gpumem_conformance::no_device::every_call_is_refused::<Hip>(|e| match e {
        Error::NoDevice { backend: "hip" } => library,
        Error::DriverNotFound { backend: "hip", .. } => !library,
        _ => false,
    });
}

/// Differs from the CUDA suite, which captures a graph and replays it: this backend offers no
/// capture. Every capture operation answers `Unsupported`, naming itself and "hip", on any
/// device and any stream, with or without a GPU: the runtime is never asked.
#[test]
fn capture_is_unsupported_without_reaching_the_runtime() {
    fn is_unsupported<T: std::fmt::Debug>(op: &'static str, r: gpumem_core::Result<T>) {
        match r {
            Err(Error::Unsupported { operation, backend: "hip" }) if operation == op => {}
            other => panic!("{op}: expected Unsupported, got {other:?}"),
        }
    }
    for (dev, stream) in [(0, HipStream::PER_THREAD), (0, HipStream::NULL), (7, HipStream::LEGACY)] {
        for mode in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
            // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
            is_unsupported("begin_capture", unsafe { Hip::begin_capture(dev, stream, mode) });
        }
        // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
        is_unsupported("end_capture", unsafe { Hip::end_capture(dev, stream) });
        // SAFETY: the stream handles here are 0, 1, 2 or streams this test created and has not destroyed.
        is_unsupported("capture_status", unsafe { Hip::capture_status(dev, stream) });
    }
    // `graph_launch`, `graph_upload` and `graph_destroy` take a `HipGraph`, and none can exist:
    // this function type-checks only because `HipGraph` has no values.
    fn no_graph_exists(graph: HipGraph) -> ! {
        match graph {}
    }
    let _: fn(HipGraph) -> ! = no_graph_exists;

    // The typed layer reads the backend's capabilities and does not ask it (after refusing the
    // default streams itself): capture is unsupported, and a stream is never capturing.
    let ptds = Stream::<Hip>::per_thread();
    is_unsupported("begin_capture", ptds.begin_capture(None));
    is_unsupported("end_capture", ptds.end_capture());
    is_unsupported("capture_status", ptds.is_capturing());
    assert!(matches!(Stream::<Hip>::null().begin_capture(None), Err(Error::CaptureOnDefaultStream)));
    assert!(matches!(Stream::<Hip>::legacy().begin_capture(None), Err(Error::CaptureOnDefaultStream)));
}

/// HIP's special stream handles: 0 is the null stream, which is also the legacy stream (HIP 5.2
/// has no legacy handle), and 2 is `hipStreamPerThread`; a raw 1 (CUDA's legacy stream) is read
/// as the legacy stream.
#[test]
fn stream_handles_keep_their_raw_values() {
    assert_eq!(Hip::stream_to_raw(Hip::null_stream()), 0);
    assert_eq!(Hip::stream_to_raw(Hip::legacy_stream()), 0);
    assert_eq!(Hip::stream_to_raw(Hip::per_thread_stream()), 2);
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

/// A stream created with the raw runtime API, wrapped as an `ExternalStream` from its address and
/// from its handle: the handle is the runtime's own, and the conformance body (asynchronous
/// memsets and copies on it, and the stream still valid after the wrapper is dropped) holds for it.
#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn external_stream_from_raw_runtime_handle() {
    require_gpu();
    // Make device 0 current, so the raw stream is created on it.
    Device::<Hip>::new(0).use_device().expect("use device 0");
    let mut raw: hipStream_t = std::ptr::null_mut();
    let hip = RawHip::load();
    // SAFETY: device 0 is current on this thread; `raw` is a valid out-pointer.
    let r = unsafe { (hip.create_with_flags)(&mut raw, hipStreamNonBlocking) };
    assert_eq!(r, HIP_SUCCESS, "hipStreamCreateWithFlags");
    assert!(!raw.is_null());
    {
        // SAFETY: `raw` is a live stream of device 0, destroyed only at the end of this test.
        let ext = unsafe { ExternalStream::<Hip>::from_ptr(raw.addr(), Some(0)) };
        assert_eq!(ext.handle().as_raw(), raw);
        // SAFETY: as above; this time wrapped from the handle itself.
        let again = unsafe { ExternalStream::<Hip>::new(HipStream::from_raw(raw), Some(0)) };
        assert_eq!((again.ptr(), again.is_owned()), (raw.addr(), false));
    }
    // SAFETY: `raw` stays a live stream of device 0 until it is destroyed below; querying it is
    // sound while it lives.
    unsafe {
        gpumem_conformance::backend::external_stream_from_a_foreign_handle::<Hip>(raw.addr(), || {
            (hip.query)(raw) == HIP_SUCCESS
        });
    }
    // SAFETY: the test created `raw` and nothing uses it any more; destroyed once.
    assert_eq!(unsafe { (hip.destroy)(raw) }, HIP_SUCCESS);
}

/// Runtime errors carry the function, the code, and the runtime's name and text for it.
#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn runtime_errors_are_mapped_with_name_code_and_text() {
    require_gpu();
    // Timing between two events never recorded: the runtime's error, whatever its code.
    let start = Event::<Hip>::new().expect("event");
    let end = Event::<Hip>::new().expect("event");
    match get_elapsed_time(&start, &end) {
        Err(Error::Backend { backend, api, code, name, message }) => {
            assert_eq!((backend, api), ("hip", "hipEventElapsedTime"));
            assert!(code != 0 && name.starts_with("hipError"), "{code} {name}");
            assert!(!message.is_empty());
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // A device ordinal the runtime does not know: hipErrorInvalidDevice, in the runtime's words.
    // (The CUDA backend finds the ordinal missing from its device table; HIP's `hipSetDevice`
    // says it.)
    match Hip::malloc(9999, 256) {
        Err(Error::Backend { backend, api, code, name, message }) => {
            assert_eq!((backend, api), ("hip", "hipSetDevice"));
            assert_eq!((code, name.as_str()), (101, "hipErrorInvalidDevice"));
            assert!(!message.is_empty());
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // The failed switch did not fool the thread's device cache: device 0 still works.
    let p = Memory::<Hip>::new_on(0, 512).expect("malloc on device 0 after the failure");
    drop(p);
}

/// What is HIP's own on a device (the backend's other operations are the conformance suite's
/// `backend_operations_on_one_device`): the gfx architecture's major as the compute capability
/// (9 for gfx90a and gfx942, 10 or 11 for RDNA; 8 or more), and the null stream's flags, which
/// the backend answers itself because HIP refuses the question. (Pageable host memory, which
/// HIP 5 answers with hipErrorInvalidValue, is read as belonging to no device; the conformance
/// body checks that answer.)
#[test]
#[ignore = "needs an AMD GPU: run with --include-ignored on a machine with one"]
fn device_properties_and_null_stream_flags_are_hips() {
    require_gpu();
    let props = Device::<Hip>::new(0).properties().expect("properties");
    assert!(props.compute_capability.0 >= 8, "{:?}", props.compute_capability);
    assert!(!Stream::<Hip>::null().is_non_blocking().expect("null stream flags"));
}
