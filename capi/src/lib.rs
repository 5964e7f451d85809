//! gpumem's memory pool behind a C ABI, for programs that take a foreign allocator: PyTorch
//! (`torch.cuda.memory.CUDAPluggableAllocator`), CuPy (`cupy.cuda.memory.CFunctionAllocator`) and
//! C or C++ code. The header is `include/gpumem.h`; a test keeps it in step with this file.
//!
//! # The contract every entry point keeps
//!
//! - **Errors.** A failing call returns its failure value (a null pointer, `-1`, or nothing for
//!   the `void` frees) and leaves a message that [`gpumem_last_error`] returns on the same thread.
//!   Every call except `gpumem_last_error` and `gpumem_version` clears the message first, so after
//!   a call that returned null, a null message means "no failure" (a zero-size allocation).
//! - **No panic crosses the boundary.** Each body runs under `catch_unwind`; a panic becomes a
//!   failure with an "internal error" message.
//! - **Threads.** Every entry point may be called from any thread at the same time as any other.
//!   A chunk may be freed on another thread than the one that allocated it.
//! - **Streams** arrive as raw handles (0: the null stream, 1: the legacy default stream, 2: the
//!   per-thread default stream, or a stream the caller created). An allocation comes from its
//!   stream's arena, so memory is reused in that stream's order. A chunk freed on another stream
//!   than its allocation's is returned only after later work on the allocation's stream is made
//!   to wait for the freeing stream's work so far. A handle that cannot be a live stream is
//!   refused with an error before anything uses it: on the host backend any value but 0, 1, 2
//!   and a stream created and not yet destroyed; on CUDA and HIP a value below 4096 or not
//!   aligned to a pointer. CUDA and HIP cannot say whether an aligned handle is live without
//!   dereferencing it, so a destroyed stream, or another object's address, is not detected there.
//! - **Freeing by address.** The ABI keeps each lent chunk under its address in a sharded map,
//!   outside the pool's own hot path. A free of an address the ABI did not lend (or already took
//!   back, or that points inside a chunk) fails with a message and frees nothing. As with any
//!   free-by-address allocator, a second free of an address that has since been lent again frees
//!   the new allocation.
//!
//! The backend is the facade's: CUDA with the `cuda` feature, HIP with `hip`, else the host
//! backend (device memory is host memory), on which the tests run.

use std::ffi::{c_char, c_double, c_int, c_void, CStr};
use std::fs::File;

use gpumem::{hooks, DebugPrintHook, GrowthPolicy, HookGuard, Limit};

mod defaults;
mod ffi;
mod oom;
mod pool;
mod record_stream;
mod recorder;
mod registry;
mod snapshot;
mod step;
mod summary;
mod text;

pub use oom::{gpumem_add_oom_observer, gpumem_clear_oom_observers, GpumemOomObserver};
pub use record_stream::gpumem_record_stream;
pub use recorder::{gpumem_recorder_start, gpumem_recorder_stop};
pub use snapshot::{gpumem_export_snapshot, gpumem_snapshot_json};
pub use step::{gpumem_plan_automatically, gpumem_plan_state, gpumem_reset_planning, gpumem_step};
pub use summary::{gpumem_memory_stats, gpumem_memory_summary, gpumem_reset_peak_stats};

use ffi::{call, fail, Failure};
use registry::{registry, FreeRequest, FAILED};

/// A stream handle: CUDA's `cudaStream_t` (or HIP's `hipStream_t`), passed as a pointer.
pub type CudaStream = *mut c_void;

/// The pool's statistics and the ABI's counters, filled in by [`gpumem_get_stats`].
///
/// The byte fields and `n_free_blocks` are those of one device's pool; the counts are the
/// ABI's, over all devices, since the process started.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpumemStats {
    /// Bytes lent out, in rounded (512-byte multiple) sizes.
    pub used_bytes: usize,
    /// Bytes cached and free: `total_bytes - used_bytes`.
    pub free_bytes: usize,
    /// Bytes the device's pool holds from the device.
    pub total_bytes: usize,
    /// The device's limit in bytes; 0 when unlimited.
    pub limit_bytes: usize,
    /// Free chunks cached by the device's pool.
    pub n_free_blocks: usize,
    /// The most bytes held from the device at once by the ABI's pool, all devices together.
    pub peak_held_bytes: usize,
    /// Addresses lent and not yet freed.
    pub n_live: u64,
    /// Successful allocations (size 0 not counted).
    pub n_mallocs: u64,
    /// Successful frees (address 0 not counted).
    pub n_frees: u64,
    /// Frees on another stream than the allocation's (included in `n_frees`).
    pub n_cross_stream_frees: u64,
    /// Failed allocation calls.
    pub n_failed_mallocs: u64,
    /// Failed free calls (unknown address, double free, mismatched device or size).
    pub n_failed_frees: u64,
    /// Failed calls of the other entry points.
    pub n_failed_other: u64,
    /// Raw allocations: driver calls (`cuMemAlloc`) made by the pool.
    pub n_raw_allocs: u64,
    /// Raw frees: driver calls (`cuMemFree`) made by the pool.
    pub n_raw_frees: u64,
}

/// Allocates `size` bytes on `device` for work on `stream`: PyTorch's `CUDAPluggableAllocator`
/// malloc (`void* (ssize_t, int, cudaStream_t)`).
///
/// PyTorch passes its current device and current stream, and later frees with the same size,
/// device and stream. The chunk comes from `stream`'s arena and is reused only in that stream's
/// order. Size 0 returns null and is not an error (as PyTorch's own allocator; PyTorch never
/// frees a null pointer).
///
/// Errors: null, with [`gpumem_last_error`] set (negative size, unknown device, a stream handle
/// that cannot be live (see "Streams" above), out of memory or over the limit, with CuPy's
/// message). PyTorch does not check the result for null, so with
/// PyTorch an allocation failure surfaces later as an illegal address; keep a limit below the
/// device's memory or check the error counters ([`gpumem_get_stats`]).
///
/// Thread-safe. Cost: a cache hit of the pool plus one lock of one of 64 shards of the address
/// map.
///
/// # Safety
///
/// `stream` is 0, 1, 2 or a live stream handle created on `device`, and stays live until every
/// chunk allocated on it is freed. Handles that cannot be live are refused (see "Streams" above);
/// on CUDA and HIP a destroyed stream's handle is not detected.
#[no_mangle]
pub unsafe extern "C" fn gpumem_torch_malloc(size: isize, device: c_int, stream: CudaStream) -> *mut c_void {
    call("gpumem_torch_malloc", std::ptr::null_mut(), || {
        let Ok(size) = usize::try_from(size) else {
            return fail!("negative size {size}");
        };
        // SAFETY: forwarded to the caller.
        let ptr = unsafe { pool::malloc(size, device, stream as usize) }?;
        Ok(ptr as *mut c_void)
    })
}

/// Frees `ptr`, allocated by [`gpumem_torch_malloc`] with `size` on `device`, after its last use
/// on `stream`: PyTorch's `CUDAPluggableAllocator` free (`void (void*, ssize_t, int,
/// cudaStream_t)`).
///
/// PyTorch passes the allocation's size, device and stream. The chunk goes back to its arena at
/// once when `stream` is the allocation's stream; on another stream, it goes back only after the
/// allocation's stream is made to wait for `stream`'s work so far (an event, no host wait). A null
/// `ptr` does nothing.
///
/// Errors: nothing is freed and [`gpumem_last_error`] is set when `ptr` is not an address gpumem
/// lent (a wrong address, a double free, a pointer inside a chunk), or `size` or `device` differ
/// from the allocation's, or `stream` cannot be a live stream (see "Streams" above; the chunk
/// stays lent). A negative `size` skips the size check.
///
/// Thread-safe; any thread may free a chunk.
///
/// # Safety
///
/// `stream` and the allocation's stream are live (as for [`gpumem_torch_malloc`]; on the host
/// backend both are checked, on CUDA and HIP only that they can be handles); nothing uses the
/// memory after its last use on `stream`.
#[no_mangle]
pub unsafe extern "C" fn gpumem_torch_free(ptr: *mut c_void, size: isize, device: c_int, stream: CudaStream) {
    call("gpumem_torch_free", (), || {
        let request = FreeRequest { ptr: ptr as usize, device, size: usize::try_from(size).ok() };
        // SAFETY: forwarded to the caller.
        unsafe { pool::free(&request, Some(stream as usize)) }
    });
}

/// Allocates `size` bytes on `device_id`: CuPy's `CFunctionAllocator` malloc (`void* (void*
/// param, size_t size, int device_id)`).
///
/// CuPy passes the `param` it was given (ignored here), the size (never 0: CuPy allocates nothing
/// for size 0) and its current device. CuPy gives no stream, so the chunk comes from the null
/// stream's arena: CuPy's default stream. Work that CuPy runs on other streams is ordered with it
/// as CuPy's own pool would order work on one stream's memory used on another: not at all; record
/// and wait on events as with CuPy's pool.
///
/// Errors: null with [`gpumem_last_error`] set. CuPy 14 does not check the result, so a bare
/// `CFunctionAllocator` would take null as memory; the Python package `gpumem_runtime` (and
/// `scripts/capi/gpumem_alloc.py`'s `use_in_cupy`) wraps it to raise `OutOfMemoryError` with
/// gpumem's message instead.
///
/// Thread-safe.
///
/// # Safety
///
/// None beyond C's: `param` is never read.
#[no_mangle]
pub unsafe extern "C" fn gpumem_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device_id: c_int,
) -> *mut c_void {
    let _ = param;
    call("gpumem_cupy_malloc", std::ptr::null_mut(), || {
        // SAFETY: the null stream (raw value 0) is always live.
        let ptr = unsafe { pool::malloc(size, device_id, 0) }?;
        Ok(ptr as *mut c_void)
    })
}

/// Frees `ptr`, allocated by [`gpumem_cupy_malloc`] on `device_id`: CuPy's `CFunctionAllocator`
/// free (`void (void* param, void* ptr, int device_id)`).
///
/// CuPy calls it when the memory object is destroyed, with the device it was allocated on. The
/// chunk goes back to its arena at once, as in CuPy's own pool. A null `ptr` does nothing.
///
/// Errors: nothing is freed and [`gpumem_last_error`] is set for an address gpumem did not lend
/// (or already took back), or another device than the allocation's.
///
/// Thread-safe; any thread may free a chunk.
///
/// # Safety
///
/// None beyond C's: `param` is never read and `ptr` is only looked up.
#[no_mangle]
pub unsafe extern "C" fn gpumem_cupy_free(param: *mut c_void, ptr: *mut c_void, device_id: c_int) {
    let _ = param;
    call("gpumem_cupy_free", (), || {
        let request = FreeRequest { ptr: ptr as usize, device: device_id, size: None };
        // SAFETY: no stream is named; the chunk goes back to its own arena.
        unsafe { pool::free(&request, None) }
    });
}

/// The message of the last failed gpumem call on the calling thread, or null when the last call
/// succeeded. The string belongs to gpumem and stays valid until this thread's next gpumem call
/// (other than `gpumem_last_error` and `gpumem_version`).
#[no_mangle]
pub extern "C" fn gpumem_last_error() -> *const c_char {
    ffi::last_error()
}

/// gpumem's version, as `"MAJOR.MINOR.PATCH"`; a static string.
#[no_mangle]
pub extern "C" fn gpumem_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Limits the bytes `device`'s pool holds from the device to `bytes`; 0 removes the limit. It
/// overrides `GPUMEM_GPU_MEMORY_LIMIT` for that device. An allocation that would pass the limit
/// first makes the pool release its cached blocks and retry, then fails.
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_set_limit(device: c_int, bytes: usize) -> c_int {
    call("gpumem_set_limit", -1, || {
        pool::device_pool(device)?.set_limit(Limit::Bytes(bytes))?;
        Ok(0)
    })
}

/// Limits `device`'s pool to `fraction` (0 to 1) of the device's memory; 0 removes the limit
/// (CuPy's `set_limit(fraction=...)`).
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown device, fraction out of range).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_set_limit_fraction(device: c_int, fraction: c_double) -> c_int {
    call("gpumem_set_limit_fraction", -1, || {
        pool::device_pool(device)?.set_limit(Limit::Fraction(fraction))?;
        Ok(0)
    })
}

/// Writes `device`'s limit in bytes (0: unlimited) to `*bytes`.
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown device, null `bytes`). Thread-safe.
///
/// # Safety
///
/// `bytes` is null or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn gpumem_get_limit(device: c_int, bytes: *mut usize) -> c_int {
    call("gpumem_get_limit", -1, || {
        let limit = pool::device_pool(device)?.get_limit()?;
        // SAFETY: the caller gives a null or writable pointer; null is refused.
        let Some(out) = (unsafe { bytes.as_mut() }) else {
            return fail!("bytes is null");
        };
        *out = limit;
        Ok(0)
    })
}

/// Sets how `device`'s pool grows, by name: `"cache_until_out_of_memory"` (CuPy's rule: cached
/// blocks stay until an allocation fails), `"release_before_grow"` (release cached whole blocks
/// before each new one), `"hold_peak_in_use"` (hold little more than the most memory in use at
/// once, at the price of raw calls on misses) or `"segments"` (size-classed blocks that settle:
/// see `GrowthPolicy::Segments`; the ABI's default, with growing blocks, see module `defaults`).
/// Other spellings of these names (`hold-peak-in-use`, `HoldPeakInUse`, any case) are accepted too.
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown name or device). Thread-safe.
///
/// # Safety
///
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_set_growth_policy(device: c_int, name: *const c_char) -> c_int {
    call("gpumem_set_growth_policy", -1, || {
        if name.is_null() {
            return fail!("name is null");
        }
        // SAFETY: the caller gives a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        // gpumem's one spelling of the names, and the others it accepts (`GrowthPolicy`'s `FromStr`).
        let policy: GrowthPolicy = name.to_string_lossy().parse()?;
        pool::device_pool(device)?.set_growth_policy(policy);
        Ok(0)
    })
}

/// The name of `device`'s growth policy (see [`gpumem_set_growth_policy`]); a static string.
///
/// Returns null with [`gpumem_last_error`] set for an unknown device. Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_get_growth_policy(device: c_int) -> *const c_char {
    call("gpumem_get_growth_policy", std::ptr::null(), || {
        Ok(pool::device_pool(device)?.growth_policy().c_name().as_ptr())
    })
}

/// Fills `*stats` with `device`'s pool statistics and the ABI's counters (see `gpumem_stats`).
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown device, null `stats`). Thread-safe;
/// while other threads allocate, the fields are each current but not one snapshot.
///
/// # Safety
///
/// `stats` is null or valid for writing one `gpumem_stats`.
#[no_mangle]
pub unsafe extern "C" fn gpumem_get_stats(device: c_int, stats: *mut GpumemStats) -> c_int {
    call("gpumem_get_stats", -1, || {
        let pool = pool::device_pool(device)?;
        let counts = registry().counts();
        let (n_failed_mallocs, n_failed_frees, n_failed_other) = FAILED.get();
        let (n_raw_allocs, n_raw_frees, _, peak_held_bytes) = pool::raw_counts().snapshot();
        let used_bytes = pool.used_bytes();
        let total_bytes = pool.total_bytes();
        let value = GpumemStats {
            used_bytes,
            free_bytes: total_bytes.saturating_sub(used_bytes),
            total_bytes,
            limit_bytes: pool.get_limit()?,
            n_free_blocks: pool.n_free_blocks(),
            peak_held_bytes,
            n_live: counts.live,
            n_mallocs: counts.mallocs,
            n_frees: counts.frees,
            n_cross_stream_frees: counts.cross_stream_frees,
            n_failed_mallocs,
            n_failed_frees,
            n_failed_other,
            n_raw_allocs: n_raw_allocs as u64,
            n_raw_frees: n_raw_frees as u64,
        };
        // SAFETY: the caller gives a null or writable pointer; null is refused.
        let Some(out) = (unsafe { stats.as_mut() }) else {
            return fail!("stats is null");
        };
        *out = value;
        Ok(0)
    })
}

/// Releases `device`'s cached free blocks to the device (CuPy's `free_all_blocks()`, PyTorch's
/// `empty_cache()`); chunks still lent stay.
///
/// Returns 0, or -1 with [`gpumem_last_error`] set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_free_all_blocks(device: c_int) -> c_int {
    call("gpumem_free_all_blocks", -1, || {
        pool::device_pool(device)?.free_all_blocks(None);
        Ok(0)
    })
}

thread_local! {
    static DEBUG_PRINT: std::cell::RefCell<Option<HookGuard<DebugPrintHook<File>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Installs gpumem's `DebugPrintHook` on the calling thread, writing CuPy's JSON lines (`alloc`,
/// `malloc`, `free`; one line per event, flushed) to the file at `path`, created or truncated.
///
/// Hooks are per thread, as CuPy's: only allocations and frees made on this thread are printed.
/// Returns 0, or -1 with [`gpumem_last_error`] set (a hook already installed here, a file that
/// cannot be created, null `path`).
///
/// # Safety
///
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_debug_print_hook_begin(path: *const c_char) -> c_int {
    call("gpumem_debug_print_hook_begin", -1, || {
        if path.is_null() {
            return fail!("path is null");
        }
        // SAFETY: the caller gives a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
        if DEBUG_PRINT.with(|slot| slot.borrow().is_some()) {
            return fail!("a DebugPrintHook is already installed on this thread");
        }
        let file = File::create(&path).map_err(|e| Failure(format!("cannot create {path:?}: {e}")))?;
        let guard = hooks::install(DebugPrintHook::with_flush(file, true))?;
        DEBUG_PRINT.with(|slot| *slot.borrow_mut() = Some(guard));
        Ok(0)
    })
}

/// Removes the `DebugPrintHook` that [`gpumem_debug_print_hook_begin`] installed on this thread
/// and closes its file.
///
/// Returns 0, or -1 with [`gpumem_last_error`] set when none is installed on this thread.
#[no_mangle]
pub extern "C" fn gpumem_debug_print_hook_end() -> c_int {
    call("gpumem_debug_print_hook_end", -1, || match DEBUG_PRINT.with(|slot| slot.borrow_mut().take()) {
        Some(guard) => {
            drop(guard);
            Ok(0)
        }
        None => fail!("no DebugPrintHook is installed on this thread"),
    })
}
