//! A trace recorded by gpumem's process-wide Recorder with call sites names the lines of this
//! file that allocated, and `gpumem-trace stats` and `plot --color-by site` read them. Its own
//! test binary: the recorder sees every thread of the process, so no other test may run beside
//! it. It passes with any debug info that has line tables: `.ci/run` also runs it built with
//! `debug = "line-tables-only"`.

use gpumem::core::SingleDeviceMemoryPool;
use gpumem::host::Host;
use gpumem_hooks::Recorder;
use gpumem_trace::plot::{self, ColorBy, PlotOptions};
use gpumem_trace::{Hook, Timeline, Trace};

/// Called by each function whose frames these tests look for, so that line-tables-only debug
/// info names it without its module path, as it names nearly every function of an optimised
/// build: that debug info describes (by name alone) only the functions that calls were inlined
/// into, and this is inlined even unoptimised. It changes nothing with other debug info.
#[inline(always)]
fn inlined_call() {
    std::hint::black_box(());
}

/// Three allocations of 3000 bytes from one line and one of 1000 from another; returns the
/// recorded text and the two lines.
fn record(pool: &SingleDeviceMemoryPool<Host>) -> (String, u32, u32) {
    inlined_call();
    let recording = Recorder::new(Vec::new()).with_call_sites().install();
    let mut live = Vec::new();
    let big_line = line!() + 2;
    for _ in 0..3 {
        live.push(pool.malloc_pooled(3000).unwrap());
    }
    let (small, small_line) = (pool.malloc_pooled(1000).unwrap(), line!());
    drop(live);
    drop(small);
    (String::from_utf8(recording.finish().unwrap()).unwrap(), big_line, small_line)
}

#[test]
fn recorded_call_sites_reach_stats_and_the_plot() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let (text, big_line, small_line) = record(&pool);
    let trace = Trace::parse(&text).unwrap();
    let mallocs: Vec<&str> = trace
        .events
        .iter()
        .filter(|e| e.kind() == Hook::Malloc)
        .map(|e| e.site.as_deref().unwrap())
        .collect();
    assert_eq!(mallocs.len(), 4, "{text}");
    // `record` as the debug info names it: with its module path, or without where it is built with
    // `debug = "line-tables-only"`, which names most functions so.
    let this_file = file!().rsplit('/').next().unwrap();
    let function = ["recorder_sites::record", "record"]
        .into_iter()
        .find(|f| mallocs[0].ends_with(&format!("{this_file}:{big_line}:{f}")))
        .unwrap_or_else(|| panic!("{:?} is not line {big_line} of record", mallocs[0]));
    let big = format!("{this_file}:{big_line}:{function}");
    let small = format!("{this_file}:{small_line}:{function}");
    assert!(mallocs[..3].iter().all(|s| s.ends_with(&big)), "{mallocs:?} end with {big:?}");
    assert!(mallocs[3].ends_with(&small), "{mallocs:?}");

    // stats: the two sites, the larger first.
    let stats = Timeline::new(&trace).stats(10).unwrap();
    let sites: Vec<(bool, u64, u64, u64)> = stats
        .sites
        .iter()
        .map(|s| (s.site.ends_with(&big), s.mallocs, s.bytes_requested, s.peak_in_use))
        .collect();
    assert_eq!(sites, [(true, 3, 9000, 9000), (false, 1, 1000, 1000)]);
    assert!(stats.sites[1].site.ends_with(&small));

    // The command line, in-process: the report's top call sites, and a page coloured by site.
    let dir = std::env::temp_dir().join(format!("gpumem-trace-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sites.trace");
    std::fs::write(&file, &text).unwrap();
    let mut out = Vec::new();
    gpumem_trace::cli::run(["gpumem-trace", "stats", file.to_str().unwrap()], &mut out).unwrap();
    let report = String::from_utf8(out).unwrap();
    let section = report.split("top call sites").nth(1).expect("a top call sites section");
    let (at_big, at_small) = (section.find(&big).unwrap(), section.find(&small).unwrap());
    assert!(at_big < at_small, "{report}");

    let layout = plot::layout(
        &Timeline::new(&trace),
        &PlotOptions { color_by: ColorBy::Site, ..PlotOptions::default() },
    )
    .unwrap();
    let labels: Vec<&str> = layout.legend.iter().map(|l| l.label.as_str()).collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(labels[0].ends_with(&big) && labels[1].ends_with(&small), "{labels:?}");
    let page = dir.join("sites.html");
    let mut out = Vec::new();
    gpumem_trace::cli::run(
        ["gpumem-trace", "plot", file.to_str().unwrap(), "-o", page.to_str().unwrap(), "--color-by", "site"],
        &mut out,
    )
    .unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(&small), "the page names the call site");
    std::fs::remove_dir_all(&dir).unwrap();
}
