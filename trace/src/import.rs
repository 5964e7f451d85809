//! Importers: CuPy's DebugPrintHook output and PyTorch's memory snapshots, into the trace format.

use std::collections::HashMap;
use std::io::{BufRead, Read};

use deser::Deserialize;

use crate::error::{Error, Result};
use crate::format::{self, Event, Header, Hook, Phase, Trace};

/// What an import kept and left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Events written.
    pub events: usize,
    /// Input lines or entries that were not memory events (program output mixed into a
    /// DebugPrintHook file; PyTorch's `snapshot` and `annotate` entries), skipped.
    pub skipped: usize,
    /// Allocations made before the recording began (freed in it, or live in the snapshot's
    /// segments without an allocation in it), put at the start of the trace.
    pub earlier_allocations: usize,
    /// Segments held before the recording began, likewise.
    pub earlier_segments: usize,
    /// Of the skipped lines, those that were not UTF-8 (CuPy import).
    pub not_utf8: usize,
    /// Lines that name a `hook` (or the header key) but are not JSON, such as a number out of
    /// range or a line cut short, skipped (CuPy import without `strict`): events that may be
    /// missing from the trace. Not counted in `skipped`.
    pub malformed_events: usize,
    /// The first such line's number.
    pub first_malformed_line: Option<usize>,
}

/// Reads CuPy DebugPrintHook output (JSON lines; CuPy's three keys sets, or any line of this
/// format). DebugPrintHook writes to standard output by default, so a captured file can hold the
/// program's own output too: lines that are not JSON objects with a `hook` key (lines that are
/// not UTF-8 among them) are skipped and counted, unless `strict`. A JSON object with a `hook`
/// key that is not a valid event is always an error. A line that names a `hook` but is not JSON
/// (a number out of range, a line cut short) is an error with `strict`, and otherwise skipped
/// and counted apart, as an event that may be missing ([`ImportReport::malformed_events`]).
///
/// # Errors
///
/// [`Error::Parse`] for a bad event line (or, with `strict`, any other line); [`Error::Io`].
pub fn cupy(reader: impl BufRead, strict: bool) -> Result<(Trace, ImportReport)> {
    let mut trace = Trace { header: Some(Header::new("cupy", None)), events: Vec::new() };
    let mut report = ImportReport::default();
    for line in format::numbered_lines(reader) {
        let (n, line) = line?;
        let Some(line) = line else {
            if strict {
                return Err(Error::Parse { line: n, message: "not UTF-8".into() });
            }
            report.skipped += 1;
            report.not_utf8 += 1;
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        if !strict {
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) if v.get("hook").is_some() || v.get(format::HEADER_KEY).is_some() => {}
                Err(_) if names_a_hook(&line) => {
                    report.malformed_events += 1;
                    report.first_malformed_line.get_or_insert(n);
                    continue;
                }
                _ => {
                    report.skipped += 1;
                    continue;
                }
            }
        }
        match format::parse_line(&line, n)? {
            format::Line::Event(e) => trace.events.push(e),
            format::Line::Header(_) => report.skipped += 1,
        }
    }
    report.events = trace.events.len();
    Ok((trace, report))
}

/// Whether a line that is not JSON still reads as an event line: an object naming a `hook` or
/// the header key.
fn names_a_hook(line: &str) -> bool {
    line.trim_start().starts_with('{')
        && (line.contains("\"hook\"") || line.contains(&format!("\"{}\"", format::HEADER_KEY)))
}

/// PyTorch's `torch.cuda.memory._snapshot()`, the parts the importer reads.
#[derive(Debug, Default, Deserialize)]
struct Snapshot {
    #[deser(default)]
    segments: Vec<Segment>,
    #[deser(default)]
    device_traces: Vec<Vec<TraceEntry>>,
}

#[derive(Debug, Deserialize)]
struct Segment {
    #[deser(default)]
    device: i64,
    address: u64,
    total_size: u64,
    #[deser(default)]
    stream: i64,
    #[deser(default)]
    blocks: Vec<Block>,
}

#[derive(Debug, Deserialize)]
struct Block {
    size: u64,
    #[deser(default)]
    requested_size: Option<u64>,
    #[deser(default)]
    address: Option<u64>,
    state: String,
    #[deser(default)]
    frames: Vec<Frame>,
}

#[derive(Debug, Deserialize)]
struct TraceEntry {
    action: String,
    #[deser(default)]
    addr: Option<u64>,
    #[deser(default)]
    size: Option<u64>,
    #[deser(default)]
    stream: Option<i64>,
    #[deser(default)]
    time_us: Option<i64>,
    #[deser(default)]
    frames: Vec<Frame>,
}

#[derive(Debug, Deserialize)]
struct Frame {
    #[deser(default)]
    filename: String,
    #[deser(default)]
    line: i64,
    #[deser(default)]
    name: String,
}

/// PyTorch's caching allocator rounds each request up to a multiple of 512 bytes (at least 512),
/// its `kMinBlockSize`. A block can be larger still when the rest of its segment was too small to
/// split off, which the trace does not record; so `mem_size` of an imported allocation is this
/// rounding, a lower bound of PyTorch's block size.
#[must_use]
pub fn torch_round_size(size: u64) -> u64 {
    size.max(1).div_ceil(512) * 512
}

/// The call site of an allocation: the innermost Python frame outside PyTorch itself, else the
/// innermost Python frame, else the innermost frame (`file:line:function`, the file's last
/// path component, as memory_viz prints frames).
fn site(frames: &[Frame]) -> Option<String> {
    let fmt = |f: &Frame| format!("{}:{}:{}", f.filename.rsplit('/').next().unwrap_or(""), f.line, f.name);
    let py = |f: &&Frame| f.filename.ends_with(".py");
    frames
        .iter()
        .filter(py)
        .find(|f| !f.filename.contains("/torch/"))
        .or_else(|| frames.iter().find(py))
        .or_else(|| frames.first())
        .map(fmt)
}

/// Reads a pickled PyTorch memory snapshot with its recorded history (`device_traces`) into a
/// trace.
///
/// Each `alloc` entry is a `malloc` (its `size` the requested size; `mem_size` by
/// [`torch_round_size`]); `free_requested` is a `free` before its operation (`"phase":"pre"`) and
/// `free_completed` the `free` itself, when the memory can be reused (PyTorch's `active` and
/// `requested` statistics drop there); `segment_alloc` and `segment_map` are raw `alloc`s,
/// `segment_free` and `segment_unmap` `raw_free`s; `oom` is a failed `malloc`. `time_us` becomes
/// `time_ns`, the innermost user frame `site`, and the pool object id is the allocation's
/// number. Allocations and segments the history frees but never allocated (made before recording
/// began, or dropped from a full history ring), and active blocks of the snapshot's segments
/// that no `alloc` entry made, are put at the start. Devices are interleaved by time when
/// several have history.
///
/// # Errors
///
/// [`Error::Snapshot`] when the pickle cannot be read or is not a snapshot.
pub fn pytorch(reader: impl Read) -> Result<(Trace, ImportReport)> {
    // PyTorch memoises the frames of its tracebacks and shares them between entries (and the
    // frame lists between an entry and its segment's); deser-pickle emits a shared value at every
    // place it is reached, as Python's unpickler does. Classes and functions are never imported:
    // a global is read as its dotted path, which no field of the snapshot needs.
    let mut reader = reader;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let snapshot: Snapshot = deser_pickle::from_slice(&bytes).map_err(|e| Error::Snapshot(e.to_string()))?;
    if snapshot.device_traces.iter().all(Vec::is_empty) {
        return Err(Error::Snapshot(
            "the snapshot has no recorded history (device_traces is empty): record it with \
             torch.cuda.memory._record_memory_history() before the allocations"
                .into(),
        ));
    }
    Ok(convert(&snapshot))
}

/// The conversion, per device then merged.
fn convert(s: &Snapshot) -> (Trace, ImportReport) {
    let mut report = ImportReport::default();
    let mut prologue: Vec<Event> = Vec::new();
    let mut body: Vec<(Option<i64>, Event)> = Vec::new();
    let mut next_id = 1u64;
    let mut timed = true;
    let devices_with_history = s.device_traces.iter().filter(|d| !d.is_empty()).count();
    for (device, entries) in s.device_traces.iter().enumerate() {
        let device_id = device as i32;
        // Live allocations by address: their pool-object id.
        let mut live: HashMap<u64, u64> = HashMap::new();
        // Live segments (and mapped ranges) by address.
        let mut segments: HashMap<u64, u64> = HashMap::new();
        for e in entries {
            let addr = e.addr.unwrap_or(0);
            let size = e.size.unwrap_or(0);
            let stream = e.stream.map(|v| v as u64);
            let base = Event {
                device_id,
                stream,
                time_ns: e.time_us.map(|t| (t.max(0) as u64).saturating_mul(1000)),
                ..Event::default()
            };
            timed &= e.time_us.is_some();
            let event = match e.action.as_str() {
                "alloc" => {
                    let id = next_id;
                    next_id += 1;
                    live.insert(addr, id);
                    Event {
                        hook: Hook::Malloc,
                        size: Some(size),
                        mem_size: torch_round_size(size),
                        mem_ptr: addr,
                        pmem_id: Some(id),
                        site: site(&e.frames),
                        ..base
                    }
                }
                "free_requested" | "free_completed" => {
                    let completed = e.action == "free_completed";
                    let id = match live.get(&addr) {
                        Some(&id) => id,
                        None => {
                            // Allocated before the history began: allocate it at the start.
                            let id = next_id;
                            next_id += 1;
                            live.insert(addr, id);
                            report.earlier_allocations += 1;
                            prologue.push(Event {
                                hook: Hook::Malloc,
                                size: Some(size),
                                mem_size: torch_round_size(size),
                                mem_ptr: addr,
                                pmem_id: Some(id),
                                site: site(&e.frames),
                                time_ns: None,
                                ..base.clone()
                            });
                            id
                        }
                    };
                    if completed {
                        live.remove(&addr);
                    }
                    Event {
                        hook: Hook::Free,
                        phase: if completed { Phase::Post } else { Phase::Pre },
                        size: Some(size),
                        mem_size: torch_round_size(size),
                        mem_ptr: addr,
                        pmem_id: Some(id),
                        ..base
                    }
                }
                "segment_alloc" | "segment_map" => {
                    segments.insert(addr, size);
                    Event { hook: Hook::Alloc, mem_size: size, mem_ptr: addr, ..base }
                }
                "segment_free" | "segment_unmap" => {
                    if segments.remove(&addr).is_none() {
                        report.earlier_segments += 1;
                        prologue.push(Event {
                            hook: Hook::Alloc,
                            mem_size: size,
                            mem_ptr: addr,
                            time_ns: None,
                            ..base.clone()
                        });
                    }
                    Event { hook: Hook::RawFree, mem_size: size, mem_ptr: addr, ..base }
                }
                "oom" => Event {
                    hook: Hook::Malloc,
                    size: Some(size),
                    mem_size: torch_round_size(size),
                    mem_ptr: 0,
                    pmem_id: Some(0),
                    site: site(&e.frames),
                    ..base
                },
                _ => {
                    report.skipped += 1;
                    continue;
                }
            };
            body.push((e.time_us, event));
        }
        // What the snapshot's final state holds that the history never made.
        for seg in s.segments.iter().filter(|seg| seg.device == device as i64) {
            let stream = Some(seg.stream as u64);
            let covered = segments.contains_key(&seg.address)
                || entries.iter().any(|e| {
                    e.action == "segment_map"
                        && e.addr.is_some_and(|a| a >= seg.address && a < seg.address + seg.total_size)
                });
            if !covered {
                report.earlier_segments += 1;
                prologue.push(Event {
                    hook: Hook::Alloc,
                    device_id,
                    mem_size: seg.total_size,
                    mem_ptr: seg.address,
                    stream,
                    ..Event::default()
                });
            }
            let mut offset = seg.address;
            for b in &seg.blocks {
                let addr = b.address.unwrap_or(offset);
                offset = addr + b.size;
                if b.state != "active_allocated" || live.contains_key(&addr) {
                    continue;
                }
                let id = next_id;
                next_id += 1;
                report.earlier_allocations += 1;
                let size = b.requested_size.unwrap_or(b.size);
                prologue.push(Event {
                    hook: Hook::Malloc,
                    device_id,
                    size: Some(size),
                    mem_size: b.size,
                    mem_ptr: addr,
                    pmem_id: Some(id),
                    stream,
                    site: site(&b.frames),
                    ..Event::default()
                });
            }
        }
    }
    if devices_with_history > 1 && timed {
        // A stable sort keeps each device's own order among equal times.
        body.sort_by_key(|(t, _)| *t);
    }
    // Raw allocations first in the prologue, so the segments exist before their blocks.
    prologue.sort_by_key(|e| e.kind() != Hook::Alloc);
    let mut events = prologue;
    events.extend(body.into_iter().map(|(_, e)| e));
    report.events = events.len();
    (Trace { header: Some(Header::new("pytorch", None)), events }, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_torchs() {
        assert_eq!(torch_round_size(0), 512);
        assert_eq!(torch_round_size(1), 512);
        assert_eq!(torch_round_size(512), 512);
        assert_eq!(torch_round_size(513), 1024);
    }

    #[test]
    fn site_prefers_user_python_frames() {
        let f =
            |filename: &str, line, name: &str| Frame { filename: filename.into(), line, name: name.into() };
        let frames = vec![
            f("??", 0, "c10::alloc"),
            f("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward"),
            f("/home/u/train.py", 42, "step"),
        ];
        assert_eq!(site(&frames).as_deref(), Some("train.py:42:step"));
        assert_eq!(site(&frames[..2]).as_deref(), Some("linear.py:125:forward"));
        assert_eq!(site(&frames[..1]).as_deref(), Some("??:0:c10::alloc"));
        assert_eq!(site(&[]), None);
    }

    #[test]
    fn cupy_skips_program_output_unless_strict() {
        let text = "hello\n{\"hook\":\"alloc\",\"device_id\":0,\"mem_size\":512,\"mem_ptr\":1}\n[1,2]\n";
        let (t, r) = cupy(text.as_bytes(), false).unwrap();
        assert_eq!((t.events.len(), r.skipped), (1, 2));
        assert!(matches!(cupy(text.as_bytes(), true), Err(Error::Parse { line: 1, .. })));
        let bad = "{\"hook\":\"malloc\",\"device_id\":0}\n";
        assert!(matches!(cupy(bad.as_bytes(), false), Err(Error::Parse { line: 1, .. })));
    }

    #[test]
    fn not_a_pickle_is_a_typed_error() {
        assert!(matches!(pytorch(&b"not a pickle"[..]), Err(Error::Snapshot(_))));
    }
}
