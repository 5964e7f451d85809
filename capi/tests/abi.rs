//! The whole C ABI, called as C calls it: allocation and free by address, the errors a C caller
//! can provoke, zero sizes, frees on other streams and other threads, configuration, statistics
//! and the debug-print hook. On the host backend these run everywhere; with a GPU backend they
//! need a device and are marked ignored (run them with `--include-ignored`).
//!
//! The ABI's pool and counters are process-wide, so the tests take one lock and each checks the
//! change of the counters it causes.

use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpumem::{MemoryPointer, Stream, UnownedMemory};
use gpumem_capi::*;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A device for the tests that change a pool's settings or need it empty: the second device where
/// there is one (the host backend simulates two), else the first.
fn spare_device() -> i32 {
    if gpumem::Device::count().expect("devices") > 1 {
        1
    } else {
        0
    }
}

fn stats(device: i32) -> GpumemStats {
    let mut s = GpumemStats::default();
    // SAFETY: `s` is a valid out-pointer.
    assert_eq!(unsafe { gpumem_get_stats(device, &mut s) }, 0, "{:?}", last_error());
    s
}

fn last_error() -> Option<String> {
    let p = gpumem_last_error();
    // SAFETY: a non-null result is a NUL-terminated string valid until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn raw(stream: &Stream) -> CudaStream {
    stream.ptr() as CudaStream
}

fn null_stream() -> CudaStream {
    std::ptr::null_mut()
}

fn torch_malloc(size: isize, device: i32, stream: CudaStream) -> *mut c_void {
    // SAFETY: `stream` is the null stream or a live stream of the test.
    unsafe { gpumem_torch_malloc(size, device, stream) }
}

fn torch_free(ptr: *mut c_void, size: isize, device: i32, stream: CudaStream) {
    // SAFETY: as `torch_malloc`.
    unsafe { gpumem_torch_free(ptr, size, device, stream) }
}

/// A view of `size` bytes at `ptr`, to copy through gpumem's checked copies.
fn view(ptr: *mut c_void, size: usize, device: i32) -> MemoryPointer {
    // SAFETY: the tests pass chunks the ABI lent and still holds, of at least `size` bytes.
    let mem = unsafe { UnownedMemory::new(ptr as usize, size, None, Some(device)) }.expect("view");
    MemoryPointer::from_memory(mem)
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn allocate_use_and_free_by_address() {
    let _s = serial();
    let before = stats(0);
    let p = torch_malloc(1000, 0, null_stream());
    assert!(!p.is_null(), "{:?}", last_error());
    assert_eq!(last_error(), None);
    assert_eq!(p as usize % 512, 0);
    let after = stats(0);
    assert_eq!(after.used_bytes - before.used_bytes, 1024);
    assert_eq!(after.n_live - before.n_live, 1);
    assert_eq!(after.n_mallocs - before.n_mallocs, 1);

    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    view(p, 1000, 0).copy_from_host(&data, 1000).expect("copy in");
    let mut back = vec![0u8; 1000];
    view(p, 1000, 0).copy_to_host(&mut back, 1000).expect("copy out");
    assert_eq!(back, data);

    torch_free(p, 1000, 0, null_stream());
    assert_eq!(last_error(), None);
    let freed = stats(0);
    assert_eq!(freed.used_bytes, before.used_bytes);
    assert_eq!(freed.n_live, before.n_live);
    assert_eq!(freed.n_frees - before.n_frees, 1);

    // The chunk is cached: the same request on the same stream gets it back, no driver call.
    let raw_before = stats(0).n_raw_allocs;
    let q = torch_malloc(1000, 0, null_stream());
    assert_eq!(q, p);
    assert_eq!(stats(0).n_raw_allocs, raw_before);
    torch_free(q, 1000, 0, null_stream());
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn cupy_entry_points_allocate_and_free() {
    let _s = serial();
    let before = stats(0);
    let param = 0xdead_usize as *mut c_void; // never read
                                             // SAFETY: `param` is never read.
    let p = unsafe { gpumem_cupy_malloc(param, 24, 0) };
    assert!(!p.is_null(), "{:?}", last_error());
    assert_eq!(stats(0).used_bytes - before.used_bytes, 512);
    // SAFETY: as above; `p` was lent by the ABI.
    unsafe { gpumem_cupy_free(param, p, 0) };
    assert_eq!(last_error(), None);
    assert_eq!(stats(0).used_bytes, before.used_bytes);
    // SAFETY: as above.
    unsafe { gpumem_cupy_free(param, p, 0) };
    assert!(last_error().expect("double free").contains("is not an address gpumem lent"));
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn zero_size_is_null_without_error() {
    let _s = serial();
    let before = stats(0);
    assert!(torch_malloc(0, 0, null_stream()).is_null());
    assert_eq!(last_error(), None);
    // SAFETY: `param` is never read.
    assert!(unsafe { gpumem_cupy_malloc(std::ptr::null_mut(), 0, 0) }.is_null());
    assert_eq!(last_error(), None);
    torch_free(std::ptr::null_mut(), 0, 0, null_stream());
    // SAFETY: as above.
    unsafe { gpumem_cupy_free(std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    assert_eq!(last_error(), None);
    let after = stats(0);
    assert_eq!(
        (after.n_mallocs, after.n_frees, after.n_live),
        (before.n_mallocs, before.n_frees, before.n_live)
    );
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn bad_requests_fail_with_a_message() {
    let _s = serial();
    let before = stats(0);
    assert!(torch_malloc(-1, 0, null_stream()).is_null());
    assert_eq!(last_error().as_deref(), Some("gpumem_torch_malloc: negative size -1"));
    assert!(torch_malloc(16, 99, null_stream()).is_null());
    assert!(last_error().expect("message").contains("device 99 does not exist"), "{:?}", last_error());
    assert!(torch_malloc(16, -3, null_stream()).is_null());
    assert!(last_error().expect("message").contains("device -3 does not exist"));
    // A size that overflows when rounded: no allocation can have it, so not an out-of-memory.
    assert!(torch_malloc(isize::MAX, 0, null_stream()).is_null());
    assert!(
        last_error().expect("message").starts_with("gpumem_torch_malloc: invalid argument: cannot allocate"),
        "{:?}",
        last_error()
    );
    // A later success clears the message.
    let p = torch_malloc(8, 0, null_stream());
    assert!(!p.is_null());
    assert_eq!(last_error(), None);
    torch_free(p, 8, 0, null_stream());
    let after = stats(0);
    assert_eq!(after.n_failed_mallocs - before.n_failed_mallocs, 4);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn wrong_address_double_free_and_mismatches_free_nothing() {
    let _s = serial();
    let before = stats(0);
    let p = torch_malloc(4096, 0, null_stream());
    assert!(!p.is_null());

    torch_free(0x1234 as *mut c_void, 16, 0, null_stream());
    assert_eq!(
        last_error().as_deref(),
        Some(
            "gpumem_torch_free: 0x1234 is not an address gpumem lent: it was never allocated here, was \
             already freed, or points inside an allocation"
        )
    );
    // SAFETY: `p + 512` is inside the chunk.
    torch_free(unsafe { p.byte_add(512) }, 16, 0, null_stream());
    assert!(last_error().expect("interior").contains("is not an address gpumem lent"));
    torch_free(p, 4095, 0, null_stream());
    assert!(last_error()
        .expect("size")
        .contains("was allocated with size 4096, freed with size 4095; nothing freed"));
    torch_free(p, 4096, 1, null_stream());
    assert!(last_error()
        .expect("device")
        .contains("was allocated on device 0, not on device 1; nothing freed"));
    assert_eq!(stats(0).n_live - before.n_live, 1, "nothing was freed");

    // A negative size skips the size check.
    torch_free(p, -1, 0, null_stream());
    assert_eq!(last_error(), None);
    torch_free(p, 4096, 0, null_stream());
    assert!(last_error().expect("double free").contains("is not an address gpumem lent"));

    let after = stats(0);
    assert_eq!(after.n_live, before.n_live);
    assert_eq!(after.n_failed_frees - before.n_failed_frees, 5);
    assert_eq!(after.n_frees - before.n_frees, 1);
}

/// A chunk freed on stream `b` while `b` still has work queued must not be reused on stream `a`
/// before that work is done: the allocation's stream is made to wait for it.
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn free_on_another_stream_orders_reuse_after_the_freeing_streams_work() {
    let _s = serial();
    let a = Stream::non_blocking().expect("stream a");
    let b = Stream::non_blocking().expect("stream b");
    let before = stats(0);
    let p = torch_malloc(2048, 0, raw(&a));
    assert!(!p.is_null(), "{:?}", last_error());

    // Work on b that is still running when the chunk is freed.
    let b_done = Arc::new(AtomicU32::new(0));
    let flag = Arc::clone(&b_done);
    b.launch_host_func(move || {
        std::thread::sleep(Duration::from_millis(200));
        flag.store(1, Ordering::SeqCst);
    })
    .expect("work on b");
    torch_free(p, 2048, 0, raw(&b));
    assert_eq!(last_error(), None);

    // Reused on a at once (same arena, same size) ...
    let q = torch_malloc(2048, 0, raw(&a));
    assert_eq!(q, p, "the freed chunk is reused from a's arena");
    // ... but a's next work runs only after b's.
    let seen = Arc::new(AtomicU32::new(u32::MAX));
    let (flag, out) = (Arc::clone(&b_done), Arc::clone(&seen));
    a.launch_host_func(move || out.store(flag.load(Ordering::SeqCst), Ordering::SeqCst)).expect("work on a");
    a.synchronize().expect("sync a");
    assert_eq!(seen.load(Ordering::SeqCst), 1, "a's work ran before b's work on the freed chunk ended");
    torch_free(q, 2048, 0, raw(&a));
    b.synchronize().expect("sync b");

    let after = stats(0);
    assert_eq!(after.n_cross_stream_frees - before.n_cross_stream_frees, 1);
    assert_eq!(after.n_live, before.n_live);
}

/// Another thread's per-thread default stream cannot be named from here: the free then waits for
/// the freeing stream instead, and the chunk still goes back.
#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn free_of_another_threads_per_thread_stream_allocation() {
    let _s = serial();
    let before = stats(0);
    let per_thread = 2usize as CudaStream;
    let p =
        std::thread::spawn(|| torch_malloc(512, 0, 2usize as CudaStream) as usize).join().expect("thread");
    assert_ne!(p, 0);
    torch_free(p as *mut c_void, 512, 0, per_thread);
    assert_eq!(last_error(), None);
    let after = stats(0);
    assert_eq!(after.n_cross_stream_frees - before.n_cross_stream_frees, 1);
    assert_eq!(after.n_live, before.n_live);
    assert_eq!(after.used_bytes, before.used_bytes);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn many_threads_allocate_and_free_on_their_own_and_other_threads() {
    let _s = serial();
    const THREADS: usize = 8;
    const ROUNDS: usize = 2000;
    let before = stats(0);
    // Each thread hands half of its chunks to its neighbour, which frees them.
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<(usize, isize)>()).unzip();
    let mut receivers: Vec<Option<mpsc::Receiver<(usize, isize)>>> =
        receivers.into_iter().map(Some).collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let to_neighbour = senders[(t + 1) % THREADS].clone();
            let from_neighbour = receivers[t].take().expect("one receiver per thread");
            std::thread::spawn(move || {
                let stream = Stream::non_blocking().expect("stream");
                let mut mine = Vec::new();
                let mut state = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for i in 0..ROUNDS {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let size = (state % 100_000) as isize + 1;
                    let p = torch_malloc(size, 0, raw(&stream));
                    assert!(!p.is_null(), "{:?}", last_error());
                    if i % 2 == 0 {
                        to_neighbour.send((p as usize, size)).expect("neighbour alive");
                    } else {
                        mine.push((p as usize, size));
                    }
                    if mine.len() > 16 {
                        let (q, s) = mine.remove(0);
                        torch_free(q as *mut c_void, s, 0, raw(&stream));
                        assert_eq!(last_error(), None);
                    }
                    while let Ok((q, s)) = from_neighbour.try_recv() {
                        // Freed on this thread's stream, not the allocation's.
                        torch_free(q as *mut c_void, s, 0, raw(&stream));
                        assert_eq!(last_error(), None);
                    }
                }
                drop(to_neighbour);
                for (q, s) in mine {
                    torch_free(q as *mut c_void, s, 0, raw(&stream));
                }
                (from_neighbour, stream)
            })
        })
        .collect();
    drop(senders);
    let mut leftovers = Vec::new();
    for h in handles {
        leftovers.push(h.join().expect("thread"));
    }
    // What arrived after a thread finished its rounds.
    for (rx, stream) in &leftovers {
        while let Ok((q, s)) = rx.recv() {
            torch_free(q as *mut c_void, s, 0, raw(stream));
            assert_eq!(last_error(), None);
        }
    }
    let after = stats(0);
    assert_eq!(after.n_live, before.n_live);
    assert_eq!(after.used_bytes, before.used_bytes);
    assert_eq!(after.n_mallocs - before.n_mallocs, (THREADS * ROUNDS) as u64);
    assert_eq!(after.n_frees - before.n_frees, (THREADS * ROUNDS) as u64);
    assert!(after.n_cross_stream_frees - before.n_cross_stream_frees >= (THREADS * ROUNDS / 2) as u64);
    assert_eq!(
        after.n_failed_mallocs + after.n_failed_frees,
        before.n_failed_mallocs + before.n_failed_frees
    );
    for (_, stream) in &leftovers {
        stream.synchronize().expect("sync");
    }
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn limit_policy_and_cache_control() {
    let _s = serial();
    let d = spare_device();
    assert_eq!(gpumem_free_all_blocks(d), 0);
    assert_eq!(stats(d).total_bytes, 0);
    assert_eq!(gpumem_set_limit(d, 1 << 20), 0);
    let mut limit = 0usize;
    // SAFETY: `limit` is a valid out-pointer.
    assert_eq!(unsafe { gpumem_get_limit(d, &mut limit) }, 0);
    assert_eq!(limit, 1 << 20);
    assert_eq!(stats(d).limit_bytes, 1 << 20);
    // SAFETY: null is refused.
    assert_eq!(unsafe { gpumem_get_limit(d, std::ptr::null_mut()) }, -1);
    assert_eq!(last_error().as_deref(), Some("gpumem_get_limit: bytes is null"));

    let p = torch_malloc(1 << 19, d, null_stream());
    assert!(!p.is_null());
    assert!(torch_malloc((1 << 19) + 1, d, null_stream()).is_null());
    assert_eq!(
        last_error().as_deref(),
        Some(
            "gpumem_torch_malloc: Out of memory allocating 524,800 bytes (allocated so far: 524,288 bytes, \
             limit set to: 1,048,576 bytes)."
        )
    );
    torch_free(p, 1 << 19, d, null_stream());
    assert_eq!(stats(d).free_bytes, 1 << 19, "cached");
    assert_eq!(gpumem_free_all_blocks(d), 0);
    assert_eq!(stats(d).total_bytes, 0, "released");
    assert_eq!(gpumem_set_limit(d, 0), 0);

    assert_eq!(gpumem_set_limit_fraction(d, 1.5), -1);
    assert!(last_error().expect("fraction").contains("memory limit fraction out of range: 1.5"));
    assert_eq!(gpumem_set_limit_fraction(d, 0.0), 0);
    assert_eq!(stats(d).limit_bytes, 0);
    assert_eq!(gpumem_set_limit(7, 0), -1);
    assert!(last_error().expect("device").contains("device 7 does not exist"));

    let name = |d| {
        let p = gpumem_get_growth_policy(d);
        assert!(!p.is_null(), "{:?}", last_error());
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_str().expect("utf-8").to_owned()
    };
    assert_eq!(name(d), "segments", "the ABI's default (module `defaults`)");
    for policy in ["hold_peak_in_use", "segments", "release_before_grow", "cache_until_out_of_memory"] {
        let c = CString::new(policy).expect("no NUL");
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { gpumem_set_growth_policy(d, c.as_ptr()) }, 0);
        assert_eq!(name(d), policy);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { gpumem_set_growth_policy(d, c"largest_first".as_ptr()) }, -1);
    assert_eq!(
        last_error().as_deref(),
        Some(
            "gpumem_set_growth_policy: invalid argument: unknown growth policy \"largest_first\"; the policies are \
             cache_until_out_of_memory, release_before_grow, hold_peak_in_use, segments"
        )
    );
    // SAFETY: null is refused.
    assert_eq!(unsafe { gpumem_set_growth_policy(d, std::ptr::null()) }, -1);
    assert!(gpumem_get_growth_policy(9).is_null());
    // SAFETY: null is refused.
    assert_eq!(unsafe { gpumem_get_stats(0, std::ptr::null_mut()) }, -1);
    assert_eq!(last_error().as_deref(), Some("gpumem_get_stats: stats is null"));
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn debug_print_hook_writes_cupys_lines() {
    let _s = serial();
    let d = spare_device();
    let path = std::env::temp_dir().join(format!("gpumem-capi-debug-print-{}.jsonl", std::process::id()));
    let c_path = CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
    assert_eq!(gpumem_free_all_blocks(d), 0);
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { gpumem_debug_print_hook_begin(c_path.as_ptr()) }, 0, "{:?}", last_error());
    // SAFETY: as above.
    assert_eq!(unsafe { gpumem_debug_print_hook_begin(c_path.as_ptr()) }, -1);
    assert!(last_error().expect("twice").contains("already installed"));
    // CuPy's example: x = cupy.array([1, 2, 3]) (24 bytes); del x.
    // SAFETY: `param` is never read.
    let x = unsafe { gpumem_cupy_malloc(std::ptr::null_mut(), 24, d) };
    assert!(!x.is_null());
    let block = stats(d).total_bytes;
    // SAFETY: as above.
    unsafe { gpumem_cupy_free(std::ptr::null_mut(), x, d) };
    assert_eq!(gpumem_debug_print_hook_end(), 0);
    assert_eq!(gpumem_debug_print_hook_end(), -1);

    let text = std::fs::read_to_string(&path).expect("hook output");
    let _ = std::fs::remove_file(&path);
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let hooks: Vec<&str> = lines.iter().map(|l| l["hook"].as_str().expect("hook name")).collect();
    assert_eq!(hooks, ["alloc", "malloc", "free"], "{text}");
    assert_eq!(lines[0]["mem_size"], block, "the raw block the pool holds");
    assert_eq!(lines[1]["size"], 24);
    assert_eq!(lines[1]["mem_size"], 512);
    assert_eq!(lines[1]["mem_ptr"], x as usize);
    assert_eq!(lines[2]["mem_ptr"], x as usize);
    assert_eq!(lines[2]["pmem_id"], lines[1]["pmem_id"]);
    assert!(lines.iter().all(|l| l["device_id"] == d));
}

#[test]
fn version_is_the_crates() {
    // SAFETY: a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(gpumem_version()) };
    assert_eq!(v.to_str(), Ok(env!("CARGO_PKG_VERSION")));
}
