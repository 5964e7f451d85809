//! Hostile traces (TR02, TR03, TR10-TR12): sums that do not fit 64 bits are a typed error, a
//! lost free line is replayed and reported, and what a lenient import skips is counted.

use gpumem_trace::import::{self, ImportReport};
use gpumem_trace::replay::{self, Step};
use gpumem_trace::{cli, Error, Timeline, Trace};

fn line(hook: &str, ptr: u64, size: u64) -> String {
    format!(r#"{{"hook":"{hook}","device_id":0,"mem_size":{size},"mem_ptr":{ptr},"size":{size}}}"#)
}

fn trace(lines: &[String]) -> Trace {
    Trace::parse(&lines.join("\n")).expect("a valid trace")
}

#[test]
fn tr10_raw_bytes_held_past_u64_are_an_overflow_error() {
    let half = 1u64 << 63;
    let t = trace(&[line("alloc", 0x1000, half), line("alloc", 0x2000, half), line("alloc", 0x3000, half)]);
    match Timeline::new(&t).stats(0) {
        Err(Error::Overflow(what)) => assert_eq!(what, "raw bytes held"),
        other => panic!("expected an overflow, got {other:?}"),
    }
}

#[test]
fn tr10_raw_bytes_allocated_past_u64_are_an_overflow_error() {
    // Never more than 2^63 held at once, but 1.5 * 2^64 allocated over the trace.
    let half = 1u64 << 63;
    let mut lines = Vec::new();
    for i in 0..3 {
        lines.push(line("alloc", 0x1000, half));
        lines.push(line("raw_free", 0x1000, half));
        lines.push(line("malloc", 0x10_0000 + i * 0x1000, 512));
    }
    match Timeline::new(&trace(&lines)).stats(0) {
        Err(Error::Overflow(what)) => assert_eq!(what, "raw bytes allocated"),
        other => panic!("expected an overflow, got {other:?}"),
    }
}

#[test]
fn tr11_bytes_requested_past_u64_are_an_overflow_error() {
    let big = u64::MAX - 1000;
    let t = trace(&[line("malloc", 0x1000, big), line("malloc", 0x2000, big)]);
    let err = Timeline::new(&t).stats(0).expect_err("an overflow");
    assert!(matches!(err, Error::Overflow(_)), "{err}");
    assert!(err.to_string().contains("exceed 2^64 - 1 bytes"), "{err}");
}

#[test]
fn sums_that_fit_are_unchanged() {
    let big = u64::MAX / 2;
    let t = trace(&[line("malloc", 0x1000, big), line("free", 0x1000, big), line("malloc", 0x2000, big)]);
    let s = Timeline::new(&t).stats(0).expect("no overflow");
    assert_eq!(s.bytes_requested, big * 2);
    assert_eq!(s.peak_in_use, big);
}

#[test]
fn tr12_a_lost_free_is_replayed_and_counted() {
    // malloc(X); malloc(X) (the free between was lost); free(X).
    let t = trace(&[line("malloc", 0x1000, 4096), line("malloc", 0x1000, 4096), line("free", 0x1000, 4096)]);
    let timeline = Timeline::new(&t);
    assert_eq!(timeline.lost_frees, 1);
    let steps = replay::steps(&timeline);
    assert_eq!(
        steps,
        [
            Step::Alloc { id: 0, size: 4096, stream: 0 },
            Step::Free { id: 0 },
            Step::Alloc { id: 1, size: 4096, stream: 0 },
            Step::Free { id: 1 },
        ]
    );
    assert_eq!(replay::peak_in_use(&steps), 4096);
    let stats = timeline.stats(0).unwrap();
    assert_eq!(stats.lost_frees, 1);
    assert_eq!(stats.peak_in_use, 4096);
    assert!(stats.render().contains("lost frees            1"), "{}", stats.render());

    let path = std::env::temp_dir().join(format!("gpumem-hostile-{}.jsonl", std::process::id()));
    t.write(std::fs::File::create(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    let args = ["gpumem-trace", "replay", "--policy", "segments", path.to_str().unwrap()];
    cli::run(args, &mut out).unwrap();
    let _ = std::fs::remove_file(&path);
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("1 free lost from the trace"), "{out}");
    assert!(out.contains("4.0 KiB"), "{out}");
    assert!(!out.contains("8.0 KiB"), "{out}");
}

fn cupy(input: &[u8], strict: bool) -> Result<ImportReport, Error> {
    import::cupy(input, strict).map(|(_, report)| report)
}

#[test]
fn tr02_a_non_utf8_line_is_skipped_and_counted_without_strict() {
    let mut input = line("malloc", 0x1000, 512).into_bytes();
    input.extend_from_slice(b"\nprogram output \xff\xfe here\n");
    input.extend_from_slice(line("free", 0x1000, 512).as_bytes());
    let (trace, report) = import::cupy(&input[..], false).expect("skipped");
    assert_eq!(trace.events.len(), 2);
    assert_eq!(report.skipped, 1);
    assert_eq!(report.not_utf8, 1);
    match cupy(&input, true) {
        Err(Error::Parse { line: 2, message }) => assert_eq!(message, "not UTF-8"),
        other => panic!("expected a parse error on line 2, got {other:?}"),
    }
    // The trace format itself is strict: the line is named.
    match Trace::read(&input[..]) {
        Err(Error::Parse { line: 2, .. }) => {}
        other => panic!("expected a parse error on line 2, got {other:?}"),
    }
}

#[test]
fn tr03_an_event_line_with_an_unparseable_number_is_counted_and_reported() {
    let bad = r#"{"hook":"malloc","device_id":0,"mem_size":1e400,"mem_ptr":4096,"size":512}"#;
    let input = [line("malloc", 0x2000, 512), bad.to_owned(), "plain output".to_owned()].join("\n");
    let report = cupy(input.as_bytes(), false).expect("lenient import");
    assert_eq!(report.events, 1);
    assert_eq!(report.malformed_events, 1);
    assert_eq!(report.first_malformed_line, Some(2));
    assert_eq!(report.skipped, 1, "only the plain output line is skipped as not an event");
    match cupy(input.as_bytes(), true) {
        Err(Error::Parse { line: 2, .. }) => {}
        other => panic!("expected a parse error on line 2, got {other:?}"),
    }
}

#[test]
fn a_plot_of_bytes_in_use_past_u64_is_an_overflow_error() {
    let big = u64::MAX - 1000;
    let t = trace(&[line("malloc", 0x1000, big), line("malloc", 0x2000, big)]);
    let options = gpumem_trace::plot::PlotOptions::default();
    match gpumem_trace::plot::layout(&Timeline::new(&t), &options) {
        Err(Error::Overflow(_)) => {}
        other => panic!("expected an overflow, got {:?}", other.map(|_| "a layout")),
    }
}
