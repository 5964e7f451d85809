//! Stream handles that cannot be live streams (CA08-CA10): refused with an error before anything
//! dereferences them, and a refused free leaves its chunk lent, to be freed properly. The
//! values below are refused by every backend (small integers and unaligned values); the host
//! backend's test also refuses a destroyed stream and an aligned address that is no stream.

use std::ffi::CStr;
use std::sync::{Mutex, MutexGuard};

use gpumem_capi::*;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn last_error() -> Option<String> {
    let p = gpumem_last_error();
    // SAFETY: a non-null result is a NUL-terminated string valid until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn n_live() -> u64 {
    let mut s = GpumemStats::default();
    // SAFETY: `s` is a valid out-pointer.
    assert_eq!(unsafe { gpumem_get_stats(0, &mut s) }, 0, "{:?}", last_error());
    s.n_live
}

/// Raw values no backend can have as a live stream: the first page, and unaligned values.
const NEVER_STREAMS: [usize; 4] = [3, 0x4000 - 1, 4095, 0xdead_beef];

/// Asserts that `malloc(stream)` fails naming the stream, and lends nothing.
fn assert_malloc_refused(stream: usize) {
    let before = n_live();
    // SAFETY: the ABI checks `stream` before using it; the test passes values it refuses.
    let p = unsafe { gpumem_torch_malloc(512, 0, stream as CudaStream) };
    assert!(p.is_null(), "stream 0x{stream:x} lent memory");
    let message = last_error().expect("an error message");
    assert!(message.contains(&format!("stream 0x{stream:x}")), "{message}");
    assert_eq!(n_live(), before);
}

/// Asserts that a free of a chunk on `stream` fails naming the stream and keeps the chunk lent,
/// and that the chunk is then freed on its own stream.
fn assert_free_refused(stream: usize) {
    // SAFETY: the null stream is always live.
    let p = unsafe { gpumem_torch_malloc(512, 0, std::ptr::null_mut()) };
    assert!(!p.is_null(), "{:?}", last_error());
    let before = n_live();
    // SAFETY: the ABI checks `stream` before using it; the test passes values it refuses.
    unsafe { gpumem_torch_free(p, 512, 0, stream as CudaStream) };
    let message = last_error().expect("an error message");
    assert!(message.contains(&format!("stream 0x{stream:x}")), "{message}");
    assert_eq!(n_live(), before, "a refused free took the chunk back");
    // SAFETY: the null stream is always live.
    unsafe { gpumem_torch_free(p, 512, 0, std::ptr::null_mut()) };
    assert_eq!(last_error(), None);
    assert_eq!(n_live(), before - 1);
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn ca08_malloc_on_a_handle_that_cannot_be_a_stream_is_refused() {
    let _s = serial();
    for stream in NEVER_STREAMS {
        assert_malloc_refused(stream);
    }
}

#[cfg_attr(any(feature = "cuda", feature = "hip"), ignore = "needs a GPU")]
#[test]
fn ca09_ca10_free_on_a_handle_that_cannot_be_a_stream_is_refused_and_keeps_the_chunk() {
    let _s = serial();
    for stream in NEVER_STREAMS {
        assert_free_refused(stream);
    }
}

/// On the host backend gpumem made every stream, so a destroyed one and an aligned address that
/// is no stream are refused too, and a live one is taken.
#[cfg(not(any(feature = "cuda", feature = "hip")))]
#[test]
fn host_backend_refuses_destroyed_streams_and_other_addresses() {
    let _s = serial();
    let stream = gpumem::Stream::non_blocking().expect("stream");
    let live = stream.ptr();
    // SAFETY: `live` is a live stream until `stream` is dropped below.
    let p = unsafe { gpumem_torch_malloc(512, 0, live as CudaStream) };
    assert!(!p.is_null(), "{:?}", last_error());
    // SAFETY: as above.
    unsafe { gpumem_torch_free(p, 512, 0, live as CudaStream) };
    assert_eq!(last_error(), None);

    // An aligned heap address that is not a stream.
    let other = Box::new([0u64; 8]);
    let address = std::ptr::from_ref(&*other) as usize;
    assert_malloc_refused(address);
    assert_free_refused(address);

    // A chunk allocated on a stream that is destroyed before a free on another stream: the
    // release cannot name the allocation's stream any more and synchronises the freeing one.
    // SAFETY: `live` is live here.
    let q = unsafe { gpumem_torch_malloc(512, 0, live as CudaStream) };
    assert!(!q.is_null(), "{:?}", last_error());
    drop(stream);
    assert_malloc_refused(live);
    let before = n_live();
    // SAFETY: the null stream is always live; the allocation's stream is checked.
    unsafe { gpumem_torch_free(q, 512, 0, std::ptr::null_mut()) };
    assert_eq!(last_error(), None);
    assert_eq!(n_live(), before - 1);
}
