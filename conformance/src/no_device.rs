//! What a GPU backend answers on a machine without its device: one typed error from every call,
//! no panic, and nothing a refused call was given (a callback) run or kept.
//!
//! Called by each GPU backend's own tests with the error it must give there (`DriverNotFound`
//! without the runtime library, `NoDevice` with it). Not part of [`suite!`](crate::suite): it runs
//! exactly where the suite shows as not run.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpumem_core::{
    CaptureMode, Device, Error, Event, EventFlags, Memory, MemoryPool, PinnedMemoryPointer, Result, Runtime,
    Stream, StreamFlags,
};

/// Asserts that every contract call and every typed entry point of backend `B` fails with an
/// error `expected` accepts. Capture calls are checked only where `B` captures (a backend
/// without capture refuses them before asking its runtime, which its own tests check).
///
/// # Panics
///
/// On the first answer `expected` does not accept, naming the call.
pub fn every_call_is_refused<B: Runtime>(expected: impl Fn(&Error) -> bool) {
    let check =
        |what: &str, refused: bool| assert!(refused, "{what}: not refused as expected without a device");
    fn is<T>(expected: &impl Fn(&Error) -> bool, r: &Result<T>) -> bool {
        r.as_ref().err().is_some_and(expected)
    }
    let null = B::null_stream();
    check("device_count", is(&expected, &B::device_count()));
    check("device_count again", is(&expected, &B::device_count()));
    check("set_device", is(&expected, &B::set_device(0)));
    check("device_properties", is(&expected, &B::device_properties(0)));
    check("mem_get_info", is(&expected, &B::mem_get_info(0)));
    check("device_synchronize", is(&expected, &B::device_synchronize(0)));
    check("can_access_peer", is(&expected, &B::can_access_peer(0, 1)));
    check("enable_peer_access", is(&expected, &B::enable_peer_access(0, 1)));
    check("pointer_device", is(&expected, &B::pointer_device(0x1000)));
    check("malloc", is(&expected, &B::malloc(0, 1024)));
    check("malloc_host", is(&expected, &B::malloc_host(0, 1024)));
    check("stream_priority_range", is(&expected, &B::stream_priority_range(0)));
    check("stream_create", is(&expected, &B::stream_create(0, StreamFlags { non_blocking: true }, 0)));
    check("event_create", is(&expected, &B::event_create(0, EventFlags::default())));
    // SAFETY: the stream handles are the backend's own null, legacy and per-thread values, valid
    // for any call; the device addresses and physical handles are never touched (each call fails
    // before using them).
    unsafe {
        check("malloc_async", is(&expected, &B::malloc_async(0, 1024, null)));
        check("stream_flags", is(&expected, &B::stream_flags(0, null)));
        check(
            "stream_flags of the per-thread stream",
            is(&expected, &B::stream_flags(0, B::per_thread_stream())),
        );
        check("stream_priority", is(&expected, &B::stream_priority(0, null)));
        check("stream_query", is(&expected, &B::stream_query(0, B::legacy_stream())));
        check("stream_synchronize", is(&expected, &B::stream_synchronize(0, B::per_thread_stream())));
        check("memcpy", is(&expected, &B::memcpy(0, 0x1000, 0x2000, 16)));
        check("memset_async", is(&expected, &B::memset_async(0, 0x1000, 1, 16, null)));
        if B::CAPS.virtual_memory {
            check("vm_granularity", is(&expected, &B::vm_granularity(0)));
            check("vm_reserve", is(&expected, &B::vm_reserve(0, 2 << 20)));
            check("vm_create", is(&expected, &B::vm_create(0, 2 << 20)));
            check("vm_map", is(&expected, &B::vm_map(0, 0x20_0000, 2 << 20, 1)));
            check("vm_set_access", is(&expected, &B::vm_set_access(0, 0x20_0000, 2 << 20, &[0])));
            check("vm_unmap", is(&expected, &B::vm_unmap(0, 0x20_0000, 2 << 20)));
            check("vm_release", is(&expected, &B::vm_release(0, 1)));
            check("vm_free_range", is(&expected, &B::vm_free_range(0, 0x20_0000, 2 << 20)));
        }
        if B::CAPS.capture {
            check("begin_capture", is(&expected, &B::begin_capture(0, null, CaptureMode::Relaxed)));
            check("end_capture", is(&expected, &B::end_capture(0, null)));
            check("capture_status", is(&expected, &B::capture_status(0, null)));
        }
    }

    // A refused callback or host function is dropped without running.
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    let callback = Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    // SAFETY: the null stream is valid for any call.
    check("add_callback", is(&expected, &unsafe { B::add_callback(0, null, callback) }));
    assert_eq!(
        (ran.load(Ordering::SeqCst), Arc::strong_count(&ran)),
        (0, 1),
        "the refused callback was kept or run"
    );
    unsafe extern "C" fn never_called(_: *mut c_void) {}
    // SAFETY: `never_called` does not unwind and ignores its argument; the null stream is valid.
    check(
        "launch_host_func",
        is(&expected, &unsafe { B::launch_host_func(0, null, never_called, std::ptr::null_mut()) }),
    );

    // The same through the typed API.
    check("Device::count", is(&expected, &Device::<B>::count()));
    check("MemoryPool::malloc", is(&expected, &MemoryPool::<B>::new().malloc(1024)));
    check("Memory::new", is(&expected, &Memory::<B>::new(1024)));
    check("Stream::non_blocking", is(&expected, &Stream::<B>::non_blocking()));
    check("Event::new", is(&expected, &Event::<B>::new()));
    check("Stream::synchronize", is(&expected, &Stream::<B>::null().synchronize()));
    check("PinnedMemoryPointer::alloc", is(&expected, &PinnedMemoryPointer::<B>::alloc(1024)));
    if B::CAPS.capture {
        check("Stream::is_capturing", is(&expected, &Stream::<B>::null().is_capturing()));
    }
}
