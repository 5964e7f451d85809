//! DebugPrintHook files (gpumem's own, and CuPy's documented sample) through the command line:
//! import, statistics and replay, against figures taken from the pool that made them or worked
//! out by hand.

use std::path::PathBuf;

use gpumem::core::hooks::install;
use gpumem::core::SingleDeviceMemoryPool;
use gpumem::host::Host;
use gpumem::{DebugPrintHook, GrowthPolicy};
use gpumem_trace::replay::{self, ReplayOptions, Step};
use gpumem_trace::{cli, Error, Timeline, Trace};
use serde_json::Value;

/// CuPy's documented DebugPrintHook output (embedded, so the test binary runs anywhere).
const CUPY_SAMPLE: &str = include_str!("../fixtures/cupy_debug_print_sample.jsonl");

/// A file in this process's own temporary folder.
fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-trace-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs the command line in-process; returns what it wrote, failing the test on an error.
fn tool(args: &[&str]) -> String {
    let mut out = Vec::new();
    if let Err(e) = cli::run(std::iter::once("gpumem-trace").chain(args.iter().copied()), &mut out) {
        panic!("gpumem-trace {args:?}: {e}");
    }
    String::from_utf8(out).unwrap()
}

/// Runs the command line in-process, expecting an error; returns its message.
fn tool_error(args: &[&str]) -> String {
    match cli::run(std::iter::once("gpumem-trace").chain(args.iter().copied()), &mut Vec::new()) {
        Ok(()) => panic!("gpumem-trace {args:?} succeeded"),
        Err(e) => e.to_string(),
    }
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&tool(args)).unwrap()
}

/// A program's pool operations, recorded by gpumem's DebugPrintHook on the host backend, with
/// the pool's own figures after each operation.
struct Recorded {
    lines: String,
    peak_used: usize,
    peak_total: usize,
    peak_requested: u64,
    mallocs: usize,
}

fn record() -> Recorded {
    // Sizes and frees chosen so that chunks are split, merged and reused: (size, free the
    // allocation made this many steps before, if any).
    let plan: &[(usize, Option<usize>)] = &[
        (24, None),
        (5000, None),
        (100_000, Some(1)),
        (700, None),
        (3 << 20, Some(2)),
        (4096, None),
        (60_000, None),
        (1, Some(4)),
        (2 << 20, Some(3)),
        (90_000, None),
        (512, Some(1)),
    ];
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let hook = install(DebugPrintHook::new(Vec::new())).unwrap();
    let mut live: Vec<Option<(gpumem::core::PooledMemory<gpumem::core::DeviceAllocator<Host>>, usize)>> =
        Vec::new();
    let (mut peak_used, mut peak_total) = (0, 0);
    let (mut requested, mut peak_requested) = (0u64, 0u64);
    for &(size, free) in plan {
        let p = pool.malloc_pooled(size).unwrap();
        requested += size as u64;
        peak_requested = peak_requested.max(requested);
        live.push(Some((p, size)));
        peak_used = peak_used.max(pool.used_bytes());
        peak_total = peak_total.max(pool.total_bytes());
        if let Some(back) = free {
            let i = live.len() - 1 - back;
            if let Some((p, size)) = live[i].take() {
                drop(p);
                requested -= size as u64;
            }
        }
    }
    drop(live);
    let lines = String::from_utf8(hook.into_inner().into_inner()).unwrap();
    Recorded { lines, peak_used, peak_total, peak_requested, mallocs: plan.len() }
}

#[test]
fn a_gpumem_debug_print_file_imports_and_replays_to_the_pools_own_peaks() {
    let rec = record();
    let raw_lines = rec.lines.lines().filter(|l| l.starts_with("{\"hook\":\"alloc\"")).count();
    let input = tmp("gpumem-debug-print.jsonl");
    std::fs::write(&input, &rec.lines).unwrap();
    let out = tmp("gpumem-debug-print.trace");
    tool(&["import", "--from", "cupy", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);

    // The imported trace is a header and then the hook's lines, byte for byte.
    let text = std::fs::read_to_string(&out).unwrap();
    let (header, body) = text.split_once('\n').unwrap();
    assert!(header.starts_with("{\"gpumem_trace\":1,\"source\":\"cupy\""), "{header}");
    assert_eq!(body, rec.lines);
    assert_eq!(Trace::parse(&text).unwrap().to_text(), text);

    let stats = json(&["stats", "--json", out.to_str().unwrap()]);
    assert_eq!(stats["mallocs"], rec.mallocs as u64);
    assert_eq!(stats["frees"], rec.mallocs as u64);
    assert_eq!(stats["peak_in_use_rounded"], rec.peak_used as u64, "the pool's used_bytes peak");
    assert_eq!(stats["peak_in_use"], rec.peak_requested);
    assert_eq!(stats["raw_allocs"], raw_lines as u64);
    // CuPy's rules release nothing here, so every raw byte is still held at the end.
    assert_eq!(stats["raw_bytes_allocated"], rec.peak_total as u64, "the pool's total_bytes peak");

    // Replayed with the policy that recorded it, the pool makes the same raw calls.
    let r = json(&["replay", "--json", "--policy", "cache-until-out-of-memory", out.to_str().unwrap()]);
    let r = &r[0];
    assert_eq!(r["policy"], "cache_until_out_of_memory");
    assert_eq!(r["peak_held"], rec.peak_total as u64);
    assert_eq!(r["peak_in_use"], rec.peak_requested);
    assert_eq!(r["raw_allocs"], raw_lines as u64);
    assert_eq!(r["raw_frees"], 0);

    // Every policy, as a table.
    let table = tool(&["replay", out.to_str().unwrap()]);
    for p in GrowthPolicy::ALL {
        assert!(table.contains(p.name()), "{table}");
    }
}

#[test]
fn cupys_documented_sample_imports_to_its_figures() {
    let sample_path = tmp("cupy-sample.jsonl");
    std::fs::write(&sample_path, CUPY_SAMPLE).unwrap();
    let sample = sample_path.to_str().unwrap();
    let out = tmp("cupy-sample.trace");
    tool(&["import", "--from", "cupy", sample, "-o", out.to_str().unwrap()]);
    let s = json(&["stats", "--json", out.to_str().unwrap()]);
    // By hand from the three lines: one raw 512-byte block; one malloc of 24 bytes, lent 512.
    assert_eq!(
        (s["mallocs"].as_u64(), s["frees"].as_u64(), s["live_at_end"].as_u64()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(s["peak_in_use"], 24);
    assert_eq!(s["peak_in_use_rounded"], 512);
    assert_eq!((s["raw_allocs"].as_u64(), s["raw_bytes_allocated"].as_u64()), (Some(1), Some(512)));
    assert_eq!(s["largest"][0]["ptr"], 150_496_608_256u64);
    let human = tool(&["stats", out.to_str().unwrap()]);
    assert!(human.contains("peak in use           24 (24 B)"), "{human}");
    // The file is a trace as it is, without importing.
    let direct = json(&["stats", "--json", sample]);
    assert_eq!(direct, s);
}

/// Peak requested bytes in use, worked out step by step (not through the crate).
fn peak_by_hand(steps: &[Step]) -> u64 {
    let mut sizes = std::collections::HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for s in steps {
        match *s {
            Step::Alloc { id, size, .. } => {
                sizes.insert(id, size as u64);
                now += size as u64;
            }
            Step::Free { id } => now -= sizes[&id],
        }
        peak = peak.max(now);
    }
    peak
}

#[test]
fn a_trace_replays_to_the_peaks_worked_out_by_hand() {
    use Step::{Alloc, Free};
    let steps = [
        Alloc { id: 0, size: 1000, stream: 0 }, // a miss: a raw 1024-byte block
        Free { id: 0 },
        Alloc { id: 1, size: 1000, stream: 0 }, // a hit on that block
        Alloc { id: 2, size: 1000, stream: 1 }, // another stream's arena: a second raw block
        Alloc { id: 3, size: 3000, stream: 0 }, // a miss: 3072 bytes
        Free { id: 1 },
        Free { id: 2 },
        Free { id: 3 },
    ];
    let r = replay::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory, ReplayOptions::default()).unwrap();
    assert_eq!(r.peak_in_use, peak_by_hand(&steps));
    assert_eq!(r.peak_in_use, 5000);
    assert_eq!((r.peak_held, r.raw_allocs, r.raw_frees), (1024 + 1024 + 3072, 3, 0));
    assert!((r.ratio - 5120.0 / 5000.0).abs() < 1e-12);
    for p in GrowthPolicy::ALL {
        let r = replay::replay(&steps, p, ReplayOptions::default()).unwrap();
        // No policy can hold less than the most in use at once, rounded to the pool's unit.
        assert!(r.peak_held >= 1024 + 1024 + 3072, "{r:?}");
        assert_eq!(r.peak_in_use, 5000);
    }
}

#[test]
fn a_trace_from_the_file_format_replays_like_its_steps() {
    let text = r#"{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":4096,"pmem_id":"0x1","stream":0}
{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":8192,"pmem_id":"0x2","stream":77}
{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":4096,"pmem_id":"0x1"}
{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":4096,"pmem_id":"0x3","stream":77}
"#;
    let steps = replay::steps(&Timeline::new(&Trace::parse(text).unwrap()));
    assert_eq!(
        steps,
        [
            Step::Alloc { id: 0, size: 1000, stream: 0 },
            Step::Alloc { id: 1, size: 1000, stream: 1 },
            Step::Free { id: 0 },
            Step::Alloc { id: 2, size: 1000, stream: 1 },
        ]
    );
    let r = replay::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory, ReplayOptions::default()).unwrap();
    // Stream 77's second allocation cannot use the null stream's freed block.
    assert_eq!((r.peak_held, r.raw_allocs, r.peak_in_use), (3 * 1024, 3, 2000));
}

#[test]
fn an_expandable_replay_grows_one_block_where_fixed_blocks_cannot_merge() {
    const MIB: usize = 1 << 20;
    // Two 30 MiB allocations freed, then one of 60 MiB: fixed blocks cannot merge, a growing
    // block can.
    let steps = [
        Step::Alloc { id: 0, size: 30 * MIB, stream: 0 },
        Step::Alloc { id: 1, size: 30 * MIB, stream: 0 },
        Step::Free { id: 0 },
        Step::Free { id: 1 },
        Step::Alloc { id: 2, size: 60 * MIB, stream: 0 },
    ];
    let policy = GrowthPolicy::CacheUntilOutOfMemory;
    let fixed = replay::replay(&steps, policy, ReplayOptions::default()).unwrap();
    assert_eq!((fixed.peak_held, fixed.raw_allocs), (120 * MIB as u64, 3));
    let grown =
        replay::replay(&steps, policy, ReplayOptions { expandable: true, ..ReplayOptions::default() })
            .unwrap();
    assert_eq!((grown.peak_held, grown.raw_allocs, grown.raw_frees), (60 * MIB as u64, 2, 0));
    assert_eq!(grown.peak_in_use, 60 * MIB as u64);
}

#[test]
fn a_shared_replay_lends_one_streams_free_memory_to_another() {
    const MIB: usize = 1 << 20;
    // Stream 1 frees 30 MiB; stream 2 then asks for as much: apart, a block of its own.
    let steps = [
        Step::Alloc { id: 0, size: 30 * MIB, stream: 1 },
        Step::Free { id: 0 },
        Step::Alloc { id: 1, size: 30 * MIB, stream: 2 },
    ];
    let policy = GrowthPolicy::CacheUntilOutOfMemory;
    let apart = replay::replay(&steps, policy, ReplayOptions::default()).unwrap();
    assert_eq!((apart.peak_held, apart.raw_allocs, apart.lent_across_streams), (60 * MIB as u64, 2, 0));
    let shared = ReplayOptions { share_across_streams: true, ..ReplayOptions::default() };
    let r = replay::replay(&steps, policy, shared).unwrap();
    assert_eq!((r.peak_held, r.raw_allocs, r.lent_across_streams), (30 * MIB as u64, 1, 1));
}

#[test]
fn bad_options_are_clear_errors() {
    let sample_path = tmp("cupy-sample-options.jsonl");
    std::fs::write(&sample_path, CUPY_SAMPLE).unwrap();
    let sample = sample_path.to_str().unwrap();
    // Expandable segments replay every policy (they were refused before the pool had them).
    assert!(tool(&["replay", "--expandable", sample]).contains("hold_peak_in_use"));
    assert!(tool(&["replay", "--share-across-streams", sample]).contains("lent across"));
    assert!(tool_error(&["replay", "--policy", "lru", sample]).contains("unknown growth policy \"lru\""));
    assert!(tool_error(&["stats", "/nonexistent/trace"]).contains("/nonexistent/trace"));
    assert!(tool_error(&["import", "--from", "matlab", sample, "-o", "-"]).contains("matlab"));
    let mut help = Vec::new();
    let e = cli::run(["gpumem-trace", "--help"], &mut help).unwrap_err();
    assert!(matches!(&e, Error::Usage(text, false) if text.contains("replay")), "{e:?}");
    // An empty trace has nothing to draw.
    let empty = tmp("empty.trace");
    std::fs::write(&empty, "").unwrap();
    assert!(tool_error(&["plot", empty.to_str().unwrap(), "-o", "-"]).contains("no pool allocation"));
}

#[test]
fn plot_writes_a_page_or_an_svg() {
    let sample_path = tmp("cupy-sample-plot.jsonl");
    std::fs::write(&sample_path, CUPY_SAMPLE).unwrap();
    let (html, svg) = (tmp("sample.html"), tmp("sample.SVG"));
    tool(&["plot", sample_path.to_str().unwrap(), "-o", html.to_str().unwrap(), "--title", "<sample>"]);
    tool(&["plot", sample_path.to_str().unwrap(), "-o", svg.to_str().unwrap(), "--color-by", "site"]);
    let html = std::fs::read_to_string(html).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<title>&lt;sample&gt;</title>"));
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(svg.matches("class=\"band\"").count(), 1);
    assert!(svg.contains("24 B (24 B requested, 512 B lent)"), "the hover text");
}

#[test]
fn plot_refuses_an_output_it_cannot_write() {
    let sample_path = tmp("cupy-sample-png.jsonl");
    std::fs::write(&sample_path, CUPY_SAMPLE).unwrap();
    let png = tmp("sample.png");
    let e = tool_error(&["plot", sample_path.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert!(e.contains(".html") && e.contains(".svg"), "{e}");
    assert!(!png.exists(), "nothing written under a .png name");
}

#[test]
fn stats_says_a_pytorch_pickle_needs_importing() {
    let pickle = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/synthetic_torch_snapshot.pickle");
    let e = tool_error(&["stats", pickle]);
    assert!(e.contains("pickle") && e.contains("gpumem-trace import --from pytorch"), "{e}");
}

#[test]
fn reports_count_events_and_give_units() {
    let sample_path = tmp("cupy-sample-units.jsonl");
    std::fs::write(&sample_path, CUPY_SAMPLE).unwrap();
    let sample = sample_path.to_str().unwrap();
    let stats = tool(&["stats", sample]);
    assert!(stats.contains("\nevents ") || stats.starts_with("events "), "{stats}");
    assert!(stats.contains(" at event ") && !stats.contains("step"), "{stats}");
    let table = tool(&["replay", sample]);
    assert!(table.contains("events replayed") && table.contains(" B "), "{table}");
}
