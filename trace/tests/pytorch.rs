//! PyTorch snapshots: the synthetic fixture that Python's own pickle wrote, snapshots built here
//! for the corner cases, and (when it is in the tree) the snapshot recorded on a GPU.

use std::collections::BTreeMap;

use gpumem_trace::import::{self, ImportReport};
use gpumem_trace::{cli, Error, Hook, Phase, Stats, Timeline, Trace};
use serde_json::Value as Json;
use serde_pickle::{HashableValue, Value};

const SYNTHETIC: &[u8] = include_bytes!("../fixtures/synthetic_torch_snapshot.pickle");
const SYNTHETIC_EXPECTED: &str = include_str!("../fixtures/synthetic_torch_snapshot.expected.json");

fn import(bytes: &[u8]) -> (Trace, ImportReport) {
    import::pytorch(bytes).unwrap()
}

#[test]
fn the_synthetic_snapshot_imports_to_the_figures_its_script_worked_out() {
    let (trace, report) = import(SYNTHETIC);
    let want: Json = serde_json::from_str(SYNTHETIC_EXPECTED).unwrap();
    let s: Stats = Timeline::new(&trace).stats(5).unwrap();
    let got = serde_json::to_value(&s).unwrap();
    for key in [
        "peak_in_use",
        "peak_held",
        "mallocs",
        "frees",
        "live_at_end",
        "failed_mallocs",
        "raw_allocs",
        "raw_frees",
    ] {
        assert_eq!(got[key], want[key], "{key}");
    }
    let streams: Vec<u64> = s.streams.iter().map(|st| st.stream).collect();
    let want_streams: Vec<u64> =
        want["streams"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(streams, want_streams);
    // The allocation freed in the history and the block live at the end, both made before it.
    assert_eq!(report.earlier_allocations, 2);
    assert_eq!(report.earlier_segments, 0);
    assert_eq!(report.skipped, 1, "the snapshot entry");
    // free_requested is a free before its operation; free_completed the free.
    let pre = trace.events.iter().filter(|e| e.kind() == Hook::Free && e.phase == Phase::Pre).count();
    let post = trace.events.iter().filter(|e| e.kind() == Hook::Free && e.phase == Phase::Post).count();
    assert_eq!((pre, post), (5, 5));
    // Times and sites come through.
    let first_alloc = trace.events.iter().find(|e| e.kind() == Hook::Malloc && e.time_ns.is_some()).unwrap();
    assert_eq!(first_alloc.time_ns, Some(1_000_014_000));
    assert_eq!(first_alloc.site.as_deref(), Some("train.py:11:step"));
    assert_eq!(first_alloc.mem_size, 3 * (1 << 20) + 512);
}

#[test]
fn imported_traces_round_trip_through_the_file_format() {
    let (trace, _) = import(SYNTHETIC);
    let text = trace.to_text();
    let back = Trace::parse(&text).unwrap();
    assert_eq!(back, trace);
    assert_eq!(back.to_text(), text);
}

#[test]
fn the_command_line_imports_a_snapshot() {
    let dir = std::env::temp_dir().join(format!("gpumem-trace-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, out) = (dir.join("synthetic.pickle"), dir.join("synthetic-torch.trace"));
    std::fs::write(&input, SYNTHETIC).unwrap();
    let args =
        ["gpumem-trace", "import", "--from", "pytorch", input.to_str().unwrap(), "-o", out.to_str().unwrap()];
    cli::run(args, &mut Vec::new()).unwrap();
    let trace = gpumem_trace::format::read_file(&out).unwrap();
    assert_eq!(trace.header.unwrap().source.as_deref(), Some("pytorch"));
    assert_eq!(trace.events, import(SYNTHETIC).0.events);
    // To standard output, with "-".
    let mut text = Vec::new();
    cli::run(["gpumem-trace", "import", "--from", "pytorch", input.to_str().unwrap(), "-o", "-"], &mut text)
        .unwrap();
    assert_eq!(Trace::parse(std::str::from_utf8(&text).unwrap()).unwrap().events, trace.events);
}

// Snapshots built here, for what the fixture does not cover.

fn dict(pairs: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        pairs.into_iter().map(|(k, v)| (HashableValue::String(k.into()), v)).collect::<BTreeMap<_, _>>(),
    )
}

fn entry(action: &str, addr: i64, size: i64, time_us: i64) -> Value {
    dict(vec![
        ("action", Value::String(action.into())),
        ("addr", Value::I64(addr)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
        ("time_us", Value::I64(time_us)),
        ("frames", Value::List(vec![])),
        ("pool_id", Value::Tuple(vec![Value::I64(0), Value::I64(0)])),
    ])
}

fn snapshot(traces: Vec<Vec<Value>>, segments: Vec<Value>) -> Vec<u8> {
    let s = dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(traces.into_iter().map(Value::List).collect())),
        ("allocator_settings", dict(vec![("expandable_segments", Value::Bool(false))])),
    ]);
    serde_pickle::value_to_vec(&s, serde_pickle::SerOptions::new()).unwrap()
}

#[test]
fn devices_are_interleaved_by_time() {
    let bytes = snapshot(
        vec![
            vec![entry("alloc", 0x1000, 100, 10), entry("free_completed", 0x1000, 100, 30)],
            vec![entry("alloc", 0x1000, 200, 20), entry("free_completed", 0x1000, 200, 40)],
        ],
        vec![],
    );
    let (trace, _) = import(&bytes);
    let order: Vec<(i32, Hook)> = trace.events.iter().map(|e| (e.device_id, e.kind())).collect();
    assert_eq!(order, [(0, Hook::Malloc), (1, Hook::Malloc), (0, Hook::Free), (1, Hook::Free)]);
    // The same address on two devices is two allocations.
    assert_eq!(Timeline::new(&trace).stats(0).unwrap().peak_in_use, 300);
}

#[test]
fn a_history_that_lost_its_start_still_balances() {
    // A full history ring drops the oldest entries: here a segment and an allocation in it
    // are freed without having been allocated.
    let bytes = snapshot(
        vec![vec![
            entry("free_requested", 0x2000, 700, 5),
            entry("free_completed", 0x2000, 700, 6),
            entry("segment_free", 0x2000, 2 << 20, 7),
            entry("alloc", 0x9000, 50, 8),
        ]],
        vec![],
    );
    let (trace, report) = import(&bytes);
    assert_eq!((report.earlier_allocations, report.earlier_segments), (1, 1));
    let s = Timeline::new(&trace).stats(0).unwrap();
    assert_eq!((s.mallocs, s.frees, s.unmatched_frees, s.peak_in_use), (2, 1, 0, 700));
    assert_eq!((s.raw_allocs, s.raw_frees, s.peak_held), (1, 1, 2 << 20));
}

#[test]
fn snapshots_without_history_or_not_snapshots_at_all_are_errors() {
    let e = import::pytorch(&snapshot(vec![vec![]], vec![])[..]).unwrap_err();
    assert!(matches!(&e, Error::Snapshot(m) if m.contains("_record_memory_history")), "{e}");
    let list = serde_pickle::value_to_vec(&Value::List(vec![Value::I64(1)]), serde_pickle::SerOptions::new())
        .unwrap();
    assert!(matches!(import::pytorch(&list[..]), Err(Error::Snapshot(_))));
}

/// The snapshot recorded on a GPU by `fixtures/make_torch_snapshot.py`, against the statistics
/// PyTorch reported in the same run. Built only when both files are in the tree (see build.rs).
#[cfg(torch_fixture)]
#[test]
fn the_recorded_snapshot_imports_to_the_peaks_pytorch_reported() {
    let (trace, _) = import(include_bytes!("../fixtures/torch_snapshot.pickle"));
    let torch: Json = serde_json::from_str(include_str!("../fixtures/torch_snapshot.stats.json")).unwrap();
    let s = Timeline::new(&trace).stats(0).unwrap();
    let t = |k: &str| torch[k].as_u64().unwrap_or_else(|| panic!("{k} missing"));
    // PyTorch's requested bytes drop when a free completes, as the importer's frees do.
    assert_eq!(s.peak_in_use, t("requested_bytes.all.peak"), "requested peak");
    assert_eq!(s.peak_held, t("reserved_bytes.all.peak"), "reserved peak");
    assert_eq!(s.raw_allocs, t("segment.all.allocated"));
    assert_eq!(s.raw_frees, t("segment.all.freed"));
    assert_eq!(s.mallocs, t("allocation.all.allocated"));
    assert_eq!(s.frees, t("allocation.all.freed"));
    assert_eq!(s.live_at_end, t("allocation.all.current"));
    // Blocks are at least the rounded request (larger where a segment's rest was not split).
    assert!(s.peak_in_use_rounded <= t("active_bytes.all.peak"));
    // PyTorch's pickle shares each traceback's frames between entries: every allocation still
    // has its own call site, in the script that recorded it.
    let sites: Vec<&str> =
        trace.events.iter().filter(|e| e.kind() == Hook::Malloc).filter_map(|e| e.site.as_deref()).collect();
    assert_eq!(sites.len() as u64, t("allocation.all.allocated"));
    // The innermost frame is the script's allocating helper, one shared frame for all of them.
    assert!(sites.iter().all(|s| *s == "make_torch_snapshot.py:34:empty"), "{sites:?}");
}
