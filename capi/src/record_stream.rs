//! `gpumem_record_stream`: memory used on another stream than its allocation's is not reused
//! before that stream's work, queued up to the free, completes (PyTorch's `recordStream`).
//!
//! The streams are noted on the chunk's entry in the address map. At the free, an event is
//! recorded on each, and the chunk goes back to the pool behind a fence of those events
//! ([`PooledMemory::free_after`](gpumem::core::PooledMemory::free_after)): the pool lends it
//! again only once every event has completed. Nothing blocks the host.

use std::ffi::{c_int, c_void};

use gpumem::core::Fence;
use gpumem::Event;

use crate::ffi::{call, Failure};
use crate::pool::{enter_device, foreign_stream};
use crate::registry::{registry, Entry, StreamId};
use crate::CudaStream;

/// Notes that the chunk at `ptr` (an address [`gpumem_torch_malloc`](crate::gpumem_torch_malloc)
/// or [`gpumem_cupy_malloc`](crate::gpumem_cupy_malloc) lent) is used by work queued on
/// `stream`: when it is freed, it is not reused before `stream`'s work queued by then completes.
/// PyTorch's `Tensor.record_stream` reaches it through its pluggable allocator's
/// `recordStream`.
///
/// Recording the allocation's own stream, or a stream twice, changes nothing. Returns 0, or -1
/// with the last error set (an address gpumem did not lend or already took back). Thread-safe.
///
/// # Safety
///
/// `stream` is 0, 1, 2 or a live stream handle on the chunk's device, and stays live until the
/// chunk is freed.
#[no_mangle]
pub unsafe extern "C" fn gpumem_record_stream(ptr: *mut c_void, stream: CudaStream) -> c_int {
    call("gpumem_record_stream", -1, || {
        let stream = StreamId::on_this_thread(stream as usize);
        registry().with_entry(ptr as usize, |entry| {
            if entry.stream != stream && !entry.recorded.contains(&stream) {
                entry.recorded.push(stream);
            }
        })?;
        Ok(0)
    })
}

/// The events recorded at a free on the streams a chunk was used on.
struct Recorded(Vec<Event>);

impl Fence for Recorded {
    fn is_complete(&self) -> bool {
        // An error here is the device's sticky one: no more work runs on it.
        self.0.iter().all(|e| e.query().unwrap_or(true))
    }

    fn wait(&self) {
        for e in &self.0 {
            // As in `is_complete`: an error means nothing more will run.
            let _ = e.synchronize();
        }
    }
}

/// The fence that `entry` must be freed behind: an event on each stream recorded for it, or
/// `None` when none was. A recorded stream that cannot take an event (another thread's
/// per-thread default stream, or a runtime error) is synchronised instead.
///
/// # Safety
///
/// The recorded streams are live (as `gpumem_record_stream`'s caller promised).
///
/// # Errors
///
/// When a recorded stream can be neither given an event nor synchronised: the chunk must then
/// never be reused.
pub(crate) unsafe fn fence_of(entry: &Entry) -> Result<Option<Box<dyn Fence>>, Failure> {
    if entry.recorded.is_empty() {
        return Ok(None);
    }
    let _device = enter_device(entry.device)?;
    let mut events = Vec::with_capacity(entry.recorded.len());
    for &id in &entry.recorded {
        // SAFETY: forwarded to the caller.
        let stream = unsafe { foreign_stream(id.ptr, entry.device) };
        match id.nameable_here().then(|| stream.record(None)) {
            Some(Ok(event)) => events.push(event),
            _ => stream.synchronize()?,
        }
    }
    Ok(Some(Box::new(Recorded(events))))
}
