//! The ABI's pool and what the entry points do with it: allocate on a caller's stream, free by
//! address, release a chunk freed on another stream, and count the driver calls.
//!
//! This is the one file that knows how gpumem's pool, streams and events are driven; the entry
//! points in `lib.rs` only convert C arguments and report failures.

use std::any::TypeId;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use gpumem::core::host::{self, Host};
use gpumem::core::pool::counting::{Counting, Counts};
use gpumem::{DefaultBackend, Device, DeviceGuard, DeviceId, DevicePtr, ExternalStream, Stream, StreamGuard};

use crate::defaults::{self, AbiAllocator};
use crate::ffi::{fail, Failure};
use crate::registry::{registry, Entry, FreeRequest, StreamId};

/// The pool every entry point allocates from: one per process, on the ABI's default allocator
/// and policy (module `defaults`) wrapped to count driver calls; each device's pool honours
/// `GPUMEM_GPU_MEMORY_LIMIT` and `GPUMEM_EXPANDABLE_SEGMENTS`.
pub(crate) fn pool() -> &'static AbiPool {
    static POOL: OnceLock<AbiPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool =
            AbiPool::with_allocator(Counting::with_counts(AbiAllocator::default(), Arc::clone(raw_counts())));
        pool.set_growth_policy(defaults::GROWTH_POLICY);
        pool
    })
}

/// The ABI's pool type: gpumem's multi-device pool on the counting allocator.
pub(crate) type AbiPool = gpumem::core::MemoryPool<DefaultBackend, CountingAllocator>;

/// One device's pool of [`AbiPool`].
pub(crate) type AbiDevicePool = gpumem::core::SingleDeviceMemoryPool<DefaultBackend, CountingAllocator>;

/// The pool of `device`.
///
/// # Errors
///
/// `InvalidArgument` for a device that does not exist; `DriverNotFound` / `NoDevice`.
pub(crate) fn device_pool(device: DeviceId) -> Result<&'static AbiDevicePool, Failure> {
    Ok(pool().device_pool(device)?)
}

/// Driver-call counts of the ABI's pool (all devices): the counters its allocator shares.
pub(crate) fn raw_counts() -> &'static Arc<Counts> {
    static RAW: OnceLock<Arc<Counts>> = OnceLock::new();
    RAW.get_or_init(Arc::default)
}

/// The runtime's device allocator (growing blocks unless `GPUMEM_EXPANDABLE_SEGMENTS=0` or the
/// backend has no virtual memory), counting each raw allocation and free into [`raw_counts`], a
/// growth as an allocation and a shrink as a free (as PyTorch counts its expandable segments'
/// maps and unmaps).
pub(crate) type CountingAllocator = Counting<AbiAllocator>;

thread_local! {
    /// The last foreign stream this thread allocated or freed on: wrapping a raw handle makes a
    /// reference-counted value, which a run of calls on one stream (the usual case) then skips.
    static LAST_STREAM: RefCell<Option<(DeviceId, usize, Stream)>> = const { RefCell::new(None) };
}

/// The foreign stream with raw value `ptr` on `device`, as a gpumem stream that never destroys it.
///
/// # Safety
///
/// `ptr` is 0, 1, 2 or a live stream handle of the backend's runtime, created on `device`, and
/// stays live while the returned stream is used.
pub(crate) unsafe fn foreign_stream(ptr: usize, device: DeviceId) -> Stream {
    let cached = LAST_STREAM
        .try_with(|last| match &*last.borrow() {
            Some((d, p, s)) if *d == device && *p == ptr => Some(s.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(stream) = cached {
        return stream;
    }
    // SAFETY: forwarded to the caller. A cached stream outliving its handle is never used again
    // unless a live stream with the same raw value is passed, and then it names that stream.
    let stream = unsafe { ExternalStream::from_ptr(ptr, Some(device)) }.into_stream();
    let _ = LAST_STREAM.try_with(|last| *last.borrow_mut() = Some((device, ptr, stream.clone())));
    stream
}

/// The lowest raw value a stream handle of a GPU runtime can have: CUDA's and HIP's handles point
/// at objects the runtime allocated, and Linux never maps the first page (`vm.mmap_min_addr` is at
/// least 4096), so a smaller value other than 0, 1 and 2 is no live handle.
const LOWEST_GPU_HANDLE: usize = 4096;

/// Refuses a stream handle that is certainly not a live stream, before anything uses it (a
/// handle is dereferenced by the backend: a bogus one would crash the process).
///
/// What is checked: 0, 1 and 2 (the null, legacy and per-thread default streams) always pass.
/// On the host backend, gpumem creates every stream, so any other value passes only while it is
/// a stream created and not yet destroyed. On CUDA and HIP the runtime creates streams and offers
/// no safe way to ask whether a handle is live (asking dereferences it), so a handle passes when
/// it could point at a runtime object: at least [`LOWEST_GPU_HANDLE`] and aligned to a pointer.
/// A destroyed stream or an arbitrary aligned address there is not detected: that remains the
/// caller's contract.
fn check_stream(ptr: usize) -> Result<(), Failure> {
    if ptr <= StreamId::PER_THREAD {
        return Ok(());
    }
    if TypeId::of::<DefaultBackend>() == TypeId::of::<Host>() {
        if host::is_live_stream(ptr) {
            return Ok(());
        }
        return fail!(
            "stream 0x{ptr:x} is not a live stream of the host backend \
             (0, 1, 2 or a stream created and not destroyed)"
        );
    }
    if ptr < LOWEST_GPU_HANDLE || !ptr.is_multiple_of(std::mem::align_of::<usize>()) {
        return fail!("stream 0x{ptr:x} cannot be a stream handle (0, 1, 2 or a stream the runtime created)");
    }
    Ok(())
}

/// Makes `device` current on this thread until the guard goes, unless it already is.
pub(crate) fn enter_device(device: DeviceId) -> Result<Option<DeviceGuard>, Failure> {
    if device < 0 {
        return fail!("device {device} does not exist");
    }
    if Device::current().id() == device {
        return Ok(None);
    }
    Ok(Some(Device::new(device).enter()?))
}

/// Allocates `size` bytes on `device` from the arena of the stream with raw value `stream`, and
/// records the chunk under its address. Size 0 gives address 0 and records nothing.
///
/// # Safety
///
/// As [`foreign_stream`], where [`check_stream`] cannot tell (a destroyed CUDA or HIP stream).
///
/// # Errors
///
/// A stream handle [`check_stream`] refuses; the pool's errors (out of memory, limit exceeded, a hook's error, an unknown device).
pub(crate) unsafe fn malloc(size: usize, device: DeviceId, stream: usize) -> Result<DevicePtr, Failure> {
    if size == 0 {
        return Ok(0);
    }
    check_stream(stream)?;
    let _device = enter_device(device)?;
    let pool = device_pool(device)?;
    // SAFETY: forwarded to the caller.
    let s = unsafe { foreign_stream(stream, device) };
    let current: StreamGuard = s.enter()?;
    let mem = pool.malloc_pooled(size)?;
    drop(current);
    registry().insert(Entry {
        mem,
        stream: StreamId::on_this_thread(stream),
        device,
        size,
        recorded: Vec::new(),
    })
}

/// Frees the chunk at `request.ptr`, which the caller says it last used on the stream with raw
/// value `stream` (`None`: on the allocation's stream). Address 0 frees nothing.
///
/// # Safety
///
/// As [`foreign_stream`] for `stream` and for the stream the chunk was allocated on (still live),
/// where [`check_stream`] cannot tell.
///
/// # Errors
///
/// A stream handle [`check_stream`] refuses (the chunk stays lent); the registry's checks (unknown address, device or size mismatch); the runtime's error when a
/// free on another stream cannot be ordered (the chunk is then withheld from reuse); a free
/// hook's error (the chunk is returned all the same).
pub(crate) unsafe fn free(request: &FreeRequest, stream: Option<usize>) -> Result<(), Failure> {
    if request.ptr == 0 {
        return Ok(());
    }
    // Checked before the chunk is taken: a refused free leaves it lent, to be freed again.
    if let Some(s) = stream {
        check_stream(s)?;
    }
    let freeing = stream.map(StreamId::on_this_thread);
    let entry = registry().take(request, |e| freeing.is_some_and(|f| f != e.stream))?;
    match freeing {
        Some(f) if f != entry.stream => {
            // SAFETY: forwarded to the caller.
            let freeing = unsafe { foreign_stream(f.ptr, entry.device) };
            // SAFETY: forwarded to the caller.
            unsafe { release_on_other_stream(entry, &freeing) }
        }
        _ => give_back(entry),
    }
}

/// Returns a chunk to its arena; behind the events of the streams recorded for it, if any
/// (`record_stream.rs`).
fn give_back(entry: Entry) -> Result<(), Failure> {
    // SAFETY: the recorded streams are live until the free, as `gpumem_record_stream` requires.
    let freed = match unsafe { crate::record_stream::fence_of(&entry) } {
        Ok(None) => entry.mem.free(),
        Ok(Some(fence)) => entry.mem.free_after(fence),
        Err(e) => {
            let addr = entry.mem.ptr();
            // Deliberately never returned to the pool: a recorded stream's work may still use it.
            std::mem::forget(entry.mem);
            return fail!("0x{addr:x} was used on a stream whose work could not be waited for ({}); it will not be reused", e.0);
        }
    };
    match freed {
        Ok(()) => Ok(()),
        Err(e) => fail!("the memory was freed, but a memory hook failed: {e}"),
    }
}

/// Returns a chunk that was freed on `freeing`, another stream than the one it was allocated
/// on, once that is safe.
///
/// The pool reuses a chunk only for allocations on its own stream's arena, in that stream's
/// order. Work queued on `freeing` may still use the chunk, so before it goes back, later work on
/// the allocation's stream is made to wait for everything queued on `freeing` so far: an event is
/// recorded on `freeing` and the allocation's stream waits on it. Nothing blocks the host. When
/// the allocation's stream cannot be named from this thread (another thread's per-thread default
/// stream) or the event cannot be recorded or waited on, `freeing` is synchronised instead. If
/// that fails too, the chunk is never reused (it stays lent until the process ends) and the
/// error is reported: a leak is sound, reuse under pending work is not.
///
/// This is the one place that ordering lives, so that a stream-ordered release in the pool can
/// replace it.
///
/// # Safety
///
/// The allocation's stream and `freeing` are live.
unsafe fn release_on_other_stream(entry: Entry, freeing: &Stream) -> Result<(), Failure> {
    // The allocation's stream may have been destroyed since (its handle then fails the check):
    // synchronising `freeing` orders the release without naming it.
    let ordered = if entry.stream.nameable_here() && check_stream(entry.stream.ptr).is_ok() {
        // SAFETY: forwarded to the caller.
        let allocation = unsafe { foreign_stream(entry.stream.ptr, entry.device) };
        // The event is made on the current device, which must be the streams' device.
        enter_device(entry.device)
            .and_then(|_device| Ok(freeing.record(None).and_then(|event| allocation.wait_event(&event))?))
    } else {
        Ok(freeing.synchronize()?)
    };
    // A stream synchronises in its own device, whichever is current.
    match ordered.or_else(|_| freeing.synchronize()) {
        Ok(()) => give_back(entry),
        Err(e) => {
            let addr = entry.mem.ptr();
            // Deliberately never returned to the pool (see above).
            std::mem::forget(entry.mem);
            fail!("0x{addr:x} was freed on another stream whose work could not be ordered ({e}); it will not be reused")
        }
    }
}
