//! The ABI's memory tools, called as C calls them: statistics under PyTorch's names, the summary,
//! the peak reset, snapshots (JSON and PyTorch's pickle), the process-wide recorder, out-of-memory
//! observers and `gpumem_record_stream`. On the host backend these run everywhere; with a GPU
//! backend they need a device and are marked ignored.
//!
//! The ABI's pool is process-wide, so the tests take one lock.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpumem::Stream;
use gpumem_capi::*;
use serde_json::Value;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn last_error() -> Option<String> {
    let p = gpumem_last_error();
    // SAFETY: a non-null result is a NUL-terminated string valid until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn malloc(size: isize, stream: &Stream) -> *mut c_void {
    // SAFETY: the stream is live until the test frees the chunk.
    let p = unsafe { gpumem_torch_malloc(size, 0, stream.ptr() as CudaStream) };
    assert!(!p.is_null(), "{:?}", last_error());
    p
}

fn free(p: *mut c_void, size: isize, stream: &Stream) {
    // SAFETY: as `malloc`.
    unsafe { gpumem_torch_free(p, size, 0, stream.ptr() as CudaStream) };
    assert_eq!(last_error(), None);
}

/// Reads one of the text entry points the way C does: the length first, then the text.
fn text(f: unsafe extern "C" fn(c_int, *mut c_char, usize) -> isize, device: c_int) -> String {
    // SAFETY: a null buffer with size 0 is allowed.
    let n = unsafe { f(device, std::ptr::null_mut(), 0) };
    assert!(n >= 0, "{:?}", last_error());
    let mut buf = vec![0u8; n as usize + 1];
    // SAFETY: `buf` has `n + 1` writable bytes.
    assert_eq!(unsafe { f(device, buf.as_mut_ptr().cast(), buf.len()) }, n);
    CStr::from_bytes_until_nul(&buf).expect("NUL-terminated").to_str().expect("UTF-8").to_owned()
}

fn stats_json() -> Value {
    serde_json::from_str(&text(gpumem_memory_stats, 0)).expect("JSON")
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn statistics_have_pytorchs_names_and_peaks_reset() {
    let _s = serial();
    let stream = Stream::non_blocking().expect("stream");
    let before = stats_json();
    let p = malloc(1 << 20, &stream);
    let during = stats_json();
    let grew = |key: &str| during[key].as_u64().unwrap() - before[key].as_u64().unwrap();
    assert_eq!(grew("allocated_bytes.all.current"), 1 << 20);
    assert_eq!(grew("requested_bytes.all.current"), 1 << 20);
    assert_eq!(grew("allocation.all.current"), 1);
    assert!(during["reserved_bytes.all.peak"].as_u64().unwrap() >= 1 << 20);
    for key in ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "segment.all.current"]
    {
        assert!(during[key].is_u64(), "{key} missing");
    }
    // The time in the driver: summed over the raw calls, so it grew with them.
    if grew("num_device_alloc") > 0 {
        assert!(grew("gpumem.driver_ns") > 0, "{during}");
    }
    assert!(during["gpumem.driver_ns"].as_u64().unwrap() > 0, "the pool has allocated: {during}");
    free(p, 1 << 20, &stream);
    let after_free = stats_json();
    assert_eq!(after_free["allocated_bytes.all.peak"], during["allocated_bytes.all.peak"]);
    assert_eq!(gpumem_reset_peak_stats(0), 0);
    let reset = stats_json();
    assert_eq!(reset["allocated_bytes.all.peak"], reset["allocated_bytes.all.current"]);

    let summary = text(gpumem_memory_summary, 0);
    assert!(summary.contains("Allocated memory") || summary.contains("allocated"), "{summary}");
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn text_is_cut_to_the_buffer_and_bad_arguments_fail() {
    let _s = serial();
    let full = text(gpumem_memory_stats, 0);
    let mut small = [0x55u8; 8];
    // SAFETY: `small` has 8 writable bytes.
    let n = unsafe { gpumem_memory_stats(0, small.as_mut_ptr().cast(), small.len()) };
    assert_eq!(n as usize, full.len(), "the full length comes back");
    assert_eq!(&small[..7], &full.as_bytes()[..7]);
    assert_eq!(small[7], 0, "NUL-terminated");
    // SAFETY: a null buffer with a nonzero size is refused, not written.
    assert_eq!(unsafe { gpumem_memory_stats(0, std::ptr::null_mut(), 4) }, -1);
    assert!(last_error().unwrap().contains("buf is null"));
    // SAFETY: as above.
    assert_eq!(unsafe { gpumem_memory_summary(-1, std::ptr::null_mut(), 0) }, -1);
    assert!(last_error().is_some());
    assert_eq!(gpumem_reset_peak_stats(-3), -1);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn snapshot_lists_segments_and_blocks_in_pytorchs_format() {
    let _s = serial();
    let stream = Stream::non_blocking().expect("stream");
    let p = malloc(3000, &stream);
    let snap: Value = serde_json::from_str(&text(gpumem_snapshot_json, 0)).expect("JSON");
    let block = snap["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap())
        .find(|b| b["address"].as_u64() == Some(p as u64))
        .expect("the allocation is in the snapshot");
    assert_eq!(block["state"], "active_allocated");
    assert_eq!(block["requested_size"], 3000);
    assert_eq!(snap["device_traces"].as_array().unwrap().len(), 1);

    let path = std::env::temp_dir().join(format!("gpumem-snapshot-{}.pickle", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { gpumem_export_snapshot(0, c_path.as_ptr()) }, 0, "{:?}", last_error());
    let bytes = std::fs::read(&path).expect("the pickle");
    assert_eq!(bytes[0], 0x80, "a pickle starts with its protocol");
    assert!(bytes.windows(b"active_allocated".len()).any(|w| w == b"active_allocated"));
    std::fs::remove_file(&path).ok();
    // SAFETY: null is refused.
    assert_eq!(unsafe { gpumem_export_snapshot(0, std::ptr::null()) }, -1);
    let bad = CString::new("/nonexistent-dir/x.pickle").unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { gpumem_export_snapshot(0, bad.as_ptr()) }, -1);
    assert!(last_error().unwrap().contains("cannot write"));
    free(p, 3000, &stream);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn recorder_sees_every_thread() {
    let _s = serial();
    let path = std::env::temp_dir().join(format!("gpumem-recording-{}.jsonl", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { gpumem_recorder_start(c_path.as_ptr()) }, 0, "{:?}", last_error());
    // SAFETY: as above.
    assert_eq!(unsafe { gpumem_recorder_start(c_path.as_ptr()) }, -1, "one recording at a time");
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                let stream = Stream::non_blocking().expect("stream");
                let p = malloc(4096, &stream);
                free(p, 4096, &stream);
            });
        }
    });
    let lines = gpumem_recorder_stop();
    assert!(lines >= 6, "3 mallocs and 3 frees at least, got {lines}");
    let text = std::fs::read_to_string(&path).expect("the recording");
    assert_eq!(text.lines().count() as i64, lines);
    let threads: std::collections::BTreeSet<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["hook"] == "malloc")
        .map(|v| v["thread"].as_u64().unwrap())
        .collect();
    assert_eq!(threads.len(), 3, "every thread's allocations are recorded");
    assert_eq!(gpumem_recorder_stop(), -1, "nothing left to stop");
    std::fs::remove_file(&path).ok();
}

static OOM_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_oom(user_data: *mut c_void, device: c_int, message: *const c_char) {
    assert_eq!(user_data as usize, 0x1234);
    assert_eq!(device, 0);
    // SAFETY: the message is valid during the call.
    let message = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    assert!(message.contains("Out of memory"), "{message}");
    OOM_CALLS.fetch_add(1, Ordering::SeqCst);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn oom_observers_see_the_failure_before_it_returns() {
    let _s = serial();
    // SAFETY: `count_oom` may run on any thread and does not unwind for the failures below.
    assert_eq!(unsafe { gpumem_add_oom_observer(0, Some(count_oom), 0x1234 as *mut c_void) }, 0);
    // SAFETY: a null observer is refused.
    assert_eq!(unsafe { gpumem_add_oom_observer(0, None, std::ptr::null_mut()) }, -1);
    let mut old = 0usize;
    // SAFETY: `old` is writable.
    assert_eq!(unsafe { gpumem_get_limit(0, &mut old) }, 0);
    assert_eq!(gpumem_set_limit(0, 1 << 20), 0);
    let before = OOM_CALLS.load(Ordering::SeqCst);
    // SAFETY: the null stream is always live.
    let p = unsafe { gpumem_torch_malloc(64 << 20, 0, std::ptr::null_mut()) };
    assert!(p.is_null());
    assert_eq!(OOM_CALLS.load(Ordering::SeqCst), before + 1);
    assert!(stats_json()["num_ooms"].as_u64().unwrap() >= 1);
    assert_eq!(gpumem_clear_oom_observers(0), 0);
    // SAFETY: as above.
    let p = unsafe { gpumem_torch_malloc(64 << 20, 0, std::ptr::null_mut()) };
    assert!(p.is_null());
    assert_eq!(OOM_CALLS.load(Ordering::SeqCst), before + 1, "cleared observers are not called");
    assert_eq!(gpumem_set_limit(0, old), 0);
}

/// Frees a chunk of stream `a` that stream `b` is still using, with or without recording `b`,
/// and tells whether `a`'s next allocation of that size got the same chunk while `b` still ran.
fn reused_while_other_stream_runs(record: bool) -> bool {
    let a = Stream::non_blocking().expect("stream a");
    let b = Stream::non_blocking().expect("stream b");
    let p = malloc(8192, &a);
    let b_done = Arc::new(AtomicU32::new(0));
    let flag = Arc::clone(&b_done);
    b.launch_host_func(move || {
        std::thread::sleep(Duration::from_millis(300));
        flag.store(1, Ordering::SeqCst);
    })
    .expect("work on b");
    if record {
        // SAFETY: `b` is live until after the free.
        assert_eq!(unsafe { gpumem_record_stream(p, b.ptr() as CudaStream) }, 0, "{:?}", last_error());
    }
    free(p, 8192, &a);
    let q = malloc(8192, &a);
    let reused = q == p && b_done.load(Ordering::SeqCst) == 0;
    b.synchronize().expect("sync b");
    free(q, 8192, &a);
    reused
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn record_stream_keeps_memory_from_reuse_until_the_stream_passes() {
    let _s = serial();
    assert!(reused_while_other_stream_runs(false), "without the record, the chunk is reused at once");
    assert!(!reused_while_other_stream_runs(true), "a recorded stream's pending work holds the chunk back");
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn record_stream_of_an_unknown_address_fails() {
    let _s = serial();
    // SAFETY: the address is only looked up.
    assert_eq!(unsafe { gpumem_record_stream(0x1000 as *mut c_void, std::ptr::null_mut()) }, -1);
    assert!(last_error().unwrap().contains("not an address gpumem lent"));
}
