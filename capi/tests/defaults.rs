//! The ABI's default without any variable set: `GrowthPolicy::Segments` with blocks that grow in
//! place where the backend has virtual memory (the host backend has). A test binary of its own:
//! `GPUMEM_EXPANDABLE_SEGMENTS` is read when a device's pool is made, once per process.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpumem::Stream;
use gpumem_capi::*;

mod common;
use common::stats;

/// The tests check device 0's totals: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Work on `stream` that is still running when the caller goes on: sets the returned flag after
/// 200 ms.
fn slow_work(stream: &Stream) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&done);
    stream
        .launch_host_func(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::SeqCst);
        })
        .expect("work on the stream");
    done
}

#[test]
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
fn the_default_is_segments_on_one_growing_block() {
    let _s = serial();
    assert!(std::env::var_os("GPUMEM_EXPANDABLE_SEGMENTS").is_none(), "run without the variable");
    // SAFETY: the null stream.
    let a = unsafe { gpumem_torch_malloc(3 << 20, 0, std::ptr::null_mut()) };
    assert!(!a.is_null());
    // SAFETY: a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(gpumem_get_growth_policy(0)) }.to_str().unwrap(), "segments");
    // Larger than any first block: the first block grows in place rather than a second being made.
    // SAFETY: the null stream.
    let b = unsafe { gpumem_torch_malloc(64 << 20, 0, std::ptr::null_mut()) };
    assert!(!b.is_null());
    assert!(b as usize > a as usize && (b as usize) < a as usize + (64 << 20), "one growing block");
    let held = stats(0).total_bytes;
    assert!(((67 << 20)..=(67 << 20) + (64 << 20) / 64 + (20 << 20)).contains(&held), "{held}");
    // SAFETY: both were lent on the null stream by the calls above and are freed once.
    unsafe {
        gpumem_torch_free(a, 3 << 20, 0, std::ptr::null_mut());
        gpumem_torch_free(b, 64 << 20, 0, std::ptr::null_mut());
    }
    assert_eq!(gpumem_free_all_blocks(0), 0);
    assert_eq!(stats(0).total_bytes, 0, "every byte went back");
}

/// A program frees through the ABI as soon as it has queued its last use of the memory. Reusing
/// the chunk on its stream is safe; giving its pages back to the device is not until that work
/// is done: a block released whole, and a growth unmapped from a block's tail, go back only once
/// the device is idle.
#[test]
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
fn memory_goes_back_to_the_device_only_after_work_queued_on_it() {
    let _s = serial();
    let stream = Stream::non_blocking().expect("stream");
    let raw = stream.ptr() as CudaStream;
    // SAFETY: `raw` is a live stream of this test (here and below).
    let first = unsafe { gpumem_torch_malloc(3 << 20, 0, raw) };
    // SAFETY: as above.
    let grown = unsafe { gpumem_torch_malloc(64 << 20, 0, raw) };
    assert!(!first.is_null() && !grown.is_null());
    let before = stats(0).total_bytes;

    // A tail: the growth that holds `grown` is unmapped while `first` stays lent.
    let done = slow_work(&stream);
    // SAFETY: lent above with this size and stream; freed once.
    unsafe { gpumem_torch_free(grown, 64 << 20, 0, raw) };
    assert_eq!(gpumem_free_all_blocks(0), 0);
    assert!(stats(0).total_bytes < before, "the growth was given back");
    assert!(done.load(Ordering::SeqCst), "a growth was unmapped under work queued on it");

    // A whole block.
    let done = slow_work(&stream);
    // SAFETY: as above.
    unsafe { gpumem_torch_free(first, 3 << 20, 0, raw) };
    assert_eq!(gpumem_free_all_blocks(0), 0);
    assert_eq!(stats(0).total_bytes, 0, "every byte went back");
    assert!(done.load(Ordering::SeqCst), "a block was freed under work queued on it");
}
