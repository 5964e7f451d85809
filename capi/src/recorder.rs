//! The process-wide recorder behind the ABI: every allocation, free and raw call of every thread
//! and every stream (PyTorch's autograd threads included), written as the JSON lines
//! `gpumem-trace` reads.

use std::ffi::{c_char, c_int, CStr};
use std::fs::File;
use std::io::BufWriter;

use gpumem::{Recorder, RecorderGuard};
use parking_lot::Mutex;

use crate::ffi::{call, fail, Failure};

/// The recording in progress, if any: one per process.
static RECORDING: Mutex<Option<RecorderGuard<BufWriter<File>>>> = Mutex::new(None);

/// Starts recording every thread's allocations, frees and raw allocations and frees, process-wide,
/// into the file at `path` (created or truncated): one JSON line per operation, CuPy's
/// DebugPrintHook keys followed by the stream, the thread and the time in nanoseconds; the trace
/// format that `gpumem-trace` reads (`gpumem-trace stats FILE`, `gpumem-trace plot FILE`).
///
/// Returns 0, or -1 with the last error set (a recording already running, null `path`, a file
/// that cannot be created). Thread-safe.
///
/// # Safety
///
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_recorder_start(path: *const c_char) -> c_int {
    call("gpumem_recorder_start", -1, || {
        if path.is_null() {
            return fail!("path is null");
        }
        // SAFETY: the caller gives a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
        let mut recording = RECORDING.lock();
        if recording.is_some() {
            return fail!("a recording is already running; stop it first");
        }
        let file = File::create(&path).map_err(|e| Failure(format!("cannot create {path:?}: {e}")))?;
        *recording = Some(Recorder::new(BufWriter::new(file)).install());
        Ok(0)
    })
}

/// Stops the recording that [`gpumem_recorder_start`] began, flushes and closes its file.
///
/// Returns the number of lines written, or -1 with the last error set (no recording running, or
/// a write error: the file then ends at the line that failed). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_recorder_stop() -> i64 {
    call("gpumem_recorder_stop", -1, || {
        let Some(guard) = RECORDING.lock().take() else {
            return fail!("no recording is running");
        };
        let lines = guard.lines();
        guard.finish().map_err(|e| Failure(format!("the recording's file could not be written: {e}")))?;
        Ok(i64::try_from(lines).unwrap_or(i64::MAX))
    })
}
