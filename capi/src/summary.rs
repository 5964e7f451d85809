//! Statistics under PyTorch's names, the summary table and the peak reset: what
//! `torch.cuda.memory_stats`, `memory_summary` and `reset_peak_memory_stats` give, for the ABI's
//! pool.

use std::ffi::{c_char, c_int};
use std::fmt::Write as _;

use gpumem::core::pool::stats::{MemoryStats, Stat};

use crate::ffi::call;
use crate::pool;
use crate::text::write_text;

/// PyTorch's statistics that gpumem counts, as `(name, stat)`: each gives
/// `"<name>.all.current"`, `.peak`, `.allocated` and `.freed`.
fn stats_by_torch_name(s: &MemoryStats) -> [(&'static str, Stat); 7] {
    [
        ("allocated_bytes", s.allocated_bytes),
        ("reserved_bytes", s.reserved_bytes),
        ("active_bytes", s.active_bytes),
        ("requested_bytes", s.requested_bytes),
        ("allocation", s.allocations),
        ("active", s.active_allocations),
        ("segment", s.segments),
    ]
}

/// The statistics of `s` as a JSON object of PyTorch's keys: each counted [`Stat`] under
/// `"<name>.all.<current|peak|allocated|freed>"`, then the counters `num_alloc_retries`,
/// `num_ooms`, `num_device_alloc`, `num_device_free`, and gpumem's own under `gpumem.`
/// (`cache_hits`, `cache_misses`, `peaks_exact` as 0 or 1, and `driver_ns`: the nanoseconds the
/// ABI's pool spent in the driver's allocation calls, every device together).
pub(crate) fn torch_stats_json(s: &MemoryStats, peaks_exact: bool, driver_ns: u64) -> String {
    let mut out = String::from("{");
    // `write!` to a String cannot fail.
    for (name, stat) in stats_by_torch_name(s) {
        for (part, value) in [
            ("current", stat.current),
            ("peak", stat.peak),
            ("allocated", stat.allocated),
            ("freed", stat.freed),
        ] {
            let _ = write!(out, "\"{name}.all.{part}\":{value},");
        }
    }
    let _ = write!(
        out,
        "\"num_alloc_retries\":{},\"num_ooms\":{},\"num_device_alloc\":{},\"num_device_free\":{},\
         \"gpumem.cache_hits\":{},\"gpumem.cache_misses\":{},\"gpumem.peaks_exact\":{},\"gpumem.driver_ns\":{}}}",
        s.retries,
        s.oom_errors,
        s.segments.allocated,
        s.segments.freed,
        s.cache_hits,
        s.cache_misses,
        u8::from(peaks_exact),
        driver_ns,
    );
    out
}

/// Writes `device`'s statistics as a JSON object with PyTorch's `memory_stats()` keys (for
/// example `"allocated_bytes.all.current"`, `"reserved_bytes.all.peak"`, `"num_alloc_retries"`,
/// `"num_ooms"`) into `buf`, `snprintf`-style: as much as fits in `len` bytes, NUL-terminated.
///
/// Returns the text's full length (without the NUL; call with `len` 0 to learn it), or -1 with
/// [`gpumem_last_error`](crate::gpumem_last_error) set (unknown device, null `buf` with a
/// nonzero `len`). Thread-safe.
///
/// # Safety
///
/// `buf` is null or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_memory_stats(device: c_int, buf: *mut c_char, len: usize) -> isize {
    call("gpumem_memory_stats", -1, || {
        let stats = pool::device_pool(device)?.stats();
        let driver_ns = pool::raw_counts().driver_ns.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: forwarded to the caller.
        unsafe { write_text(&torch_stats_json(&stats.all, stats.peaks_exact, driver_ns), buf, len) }
    })
}

/// Writes `device`'s statistics as a readable table (PyTorch's `memory_summary()`: each
/// statistic's current value, peak, totals allocated and freed, for the pool and each stream)
/// into `buf`, `snprintf`-style (see [`gpumem_memory_stats`]).
///
/// Returns the text's full length, or -1 with the last error set. Thread-safe.
///
/// # Safety
///
/// `buf` is null or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_memory_summary(device: c_int, buf: *mut c_char, len: usize) -> isize {
    call("gpumem_memory_summary", -1, || {
        let summary = pool::device_pool(device)?.memory_summary();
        // SAFETY: forwarded to the caller.
        unsafe { write_text(&summary, buf, len) }
    })
}

/// Sets every peak of `device`'s statistics to its current value (PyTorch's
/// `reset_peak_memory_stats()`).
///
/// Returns 0, or -1 with the last error set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats(device: c_int) -> c_int {
    call("gpumem_reset_peak_stats", -1, || {
        pool::device_pool(device)?.reset_peak();
        Ok(0)
    })
}
