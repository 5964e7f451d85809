//! The pool's segments and blocks as PyTorch's `torch.cuda.memory._snapshot()` gives them: as
//! JSON for a caller to read, and as the pickle file PyTorch's memory viewer
//! (`torch.cuda._memory_viz`, pytorch.org/memory_viz) opens.

use std::ffi::{c_char, c_int, CStr};
use std::fs::File;
use std::io::{BufWriter, Write as _};

use gpumem::core::pool::stats::{BlockState, PoolSnapshot};
use serde_json::{json, Value};

use crate::ffi::{call, fail, Failure};
use crate::pool;
use crate::text::write_text;

/// PyTorch's name of a block's state.
fn torch_state(state: BlockState) -> &'static str {
    match state {
        BlockState::Free => "inactive",
        BlockState::Allocated => "active_allocated",
        BlockState::PendingFree => "active_pending_free",
    }
}

/// The segments of `snapshot` as PyTorch's segment dicts: each with its device, address, sizes
/// (total, allocated, active, requested), stream, `segment_type` and `blocks` (address, size,
/// requested size, state, no frames: gpumem records no stacks here).
pub(crate) fn torch_segments(snapshot: &PoolSnapshot) -> Vec<Value> {
    snapshot
        .segments
        .iter()
        .map(|seg| {
            let sum = |pick: fn(BlockState) -> bool,
                       of: fn(&gpumem::core::pool::stats::BlockSnapshot) -> usize| {
                seg.blocks.iter().filter(|b| pick(b.state)).map(of).sum::<usize>()
            };
            let blocks: Vec<Value> = seg
                .blocks
                .iter()
                .map(|b| {
                    json!({
                        "address": b.address,
                        "size": b.size,
                        "requested_size": b.requested_size,
                        "state": torch_state(b.state),
                        "frames": [],
                    })
                })
                .collect();
            json!({
                "device": snapshot.device,
                "address": seg.address,
                "total_size": seg.total_size,
                "allocated_size": sum(|s| s == BlockState::Allocated, |b| b.size),
                "active_size": sum(|s| s != BlockState::Free, |b| b.size),
                "requested_size": sum(|s| s == BlockState::Allocated, |b| b.requested_size),
                "stream": seg.arena.raw(),
                "segment_type": "large",
                "segment_pool_id": [0, 0],
                "is_expandable": false,
                "frames": [],
                "blocks": blocks,
            })
        })
        .collect()
}

/// `device`'s snapshot as the dict PyTorch's `_snapshot()` returns: its segments, and
/// `device_traces` with one empty history per device up to `device` (gpumem's history is the
/// recorder's file, not part of the snapshot).
pub(crate) fn torch_snapshot(device: c_int) -> Result<Value, Failure> {
    let snapshot = pool::device_pool(device)?.snapshot();
    let traces: Vec<Value> = (0..=device).map(|_| json!([])).collect();
    Ok(json!({
        "segments": torch_segments(&snapshot),
        "device_traces": traces,
        "allocator_settings": {"backend": "gpumem"},
    }))
}

/// Writes `device`'s snapshot (see [`gpumem_export_snapshot`]) as JSON into `buf`,
/// `snprintf`-style: as much as fits in `len` bytes, NUL-terminated.
///
/// Returns the text's full length (call with `len` 0 to learn it), or -1 with the last error set
/// (unknown device, null `buf` with a nonzero `len`). Thread-safe; the snapshot is taken one
/// stream at a time.
///
/// # Safety
///
/// `buf` is null or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_snapshot_json(device: c_int, buf: *mut c_char, len: usize) -> isize {
    call("gpumem_snapshot_json", -1, || {
        let text = torch_snapshot(device)?.to_string();
        // SAFETY: forwarded to the caller.
        unsafe { write_text(&text, buf, len) }
    })
}

/// Writes `device`'s segments and blocks to the file at `path` (created or truncated) in
/// PyTorch's snapshot pickle format: the dict `torch.cuda.memory._snapshot()` returns, with
/// `"segments"` (PyTorch's keys and block states: `inactive`, `active_allocated`,
/// `active_pending_free`) and `"device_traces"`. `python -m torch.cuda._memory_viz
/// segment_plot FILE -o page.html` and pytorch.org/memory_viz open it.
///
/// Returns 0, or -1 with the last error set (unknown device, null `path`, a file that cannot be
/// written). Thread-safe.
///
/// # Safety
///
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_export_snapshot(device: c_int, path: *const c_char) -> c_int {
    call("gpumem_export_snapshot", -1, || {
        if path.is_null() {
            return fail!("path is null");
        }
        // SAFETY: the caller gives a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
        let snapshot = torch_snapshot(device)?;
        let cannot = |e: &dyn std::fmt::Display| Failure(format!("cannot write {path:?}: {e}"));
        let mut out = BufWriter::new(File::create(&path).map_err(|e| cannot(&e))?);
        serde_pickle::to_writer(&mut out, &snapshot, serde_pickle::SerOptions::new())
            .map_err(|e| cannot(&e))?;
        out.flush().map_err(|e| cannot(&e))?;
        Ok(0)
    })
}
