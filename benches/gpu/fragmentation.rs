//! Fragmentation: every policy replaying the traces with its raw calls counted, beside PyTorch's
//! and CuPy's figures.

use gpumem::core::pool::counting::Counting;
use gpumem::core::pool::expandable::{self, ExpandableAllocator};
use gpumem::core::pool::trace;
use gpumem::core::ArenaKey;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use gpumem::{DefaultBackend as B, DeviceAllocator, GrowthPolicy, RawAllocator};

use crate::report::Report;
use crate::timing::{dev, median};

/// What one replay of a trace through a fresh pool measured.
#[derive(Clone)]
pub(crate) struct Replayed {
    ratio: f64,
    allocs: usize,
    frees: usize,
    /// Raw allocations and frees from each of the replay's marks to the next (the last: to the
    /// end): for a training trace, its second step, then its third and later steps.
    in_steps: Vec<usize>,
    ms: f64,
    /// The time spent in the raw allocator's calls during the replay (raw allocations, growths,
    /// shrinks and frees), in milliseconds: part of `ms`.
    driver_ms: f64,
    /// Allocations served by another stream's free chunk.
    across: u64,
}

/// How a replay's pool is set up: its policy, its raw allocator, and whether it lends memory
/// across the trace's streams.
#[derive(Clone, Copy)]
pub(crate) struct Setup {
    policy: GrowthPolicy,
    raw: Raw,
    share: bool,
}

/// The raw allocator of a replay.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raw {
    /// `cuMemAlloc` per block.
    Plain,
    /// Expandable segments on the virtual-memory API.
    Expandable,
    /// Expandable segments that move the pages under free chunks where a growth needs them.
    Stitching,
}

/// Replays a trace through a fresh pool (the pool's own API, each trace stream its own arena)
/// with `policy`, timed from the first step to a device synchronisation after the last (the pool
/// is made before and dropped after the clock). Raw frees are those made during the replay.
pub(crate) fn replay_once(steps: &[trace::Step], marks: &[usize], setup: Setup) -> Replayed {
    fn run<A: RawAllocator + Clone>(
        steps: &[trace::Step],
        marks: &[usize],
        policy: GrowthPolicy,
        counting: Counting<A>,
        share: bool,
    ) -> Replayed {
        let expandable = counting.expandable();
        let counts = Arc::clone(counting.counts());
        let pool = gpumem::core::pool::Pool::new(dev(), counting);
        pool.set_growth_policy(policy);
        if expandable {
            pool.set_expandable_segments(true).unwrap();
        }
        let cache = gpumem::core::pool::ArenaCache::new();
        // Sharing across streams orders real streams with events (the runtime's order), so its
        // cost is in the time: each trace stream is a stream of its own.
        let streams: Vec<gpumem::Stream> = if share {
            let n = steps
                .iter()
                .map(|s| if let trace::Step::Alloc { stream, .. } = s { *stream + 1 } else { 0 })
                .max();
            (0..n.unwrap_or(1)).map(|_| gpumem::Stream::non_blocking().unwrap()).collect()
        } else {
            Vec::new()
        };
        let keys: Vec<ArenaKey> = if share {
            pool.set_stream_order(Box::new(gpumem::core::runtime::pools::EventStreamOrder::<B>::new(dev())));
            pool.set_share_across_streams(true).unwrap();
            streams.iter().map(|s| ArenaKey::stream(s.ptr())).collect()
        } else {
            (0..64).map(ArenaKey::stream).collect()
        };
        let mut live = HashMap::with_capacity(steps.len());
        let calls = || counts.allocs.load(Ordering::Relaxed) + counts.frees.load(Ordering::Relaxed);
        let mut per_step = trace::CountsBetweenMarks::new(marks);
        let driver_before = counts.driver_ns.load(Ordering::Relaxed);
        let t = Instant::now();
        for (i, step) in steps.iter().enumerate() {
            per_step.at(i, calls());
            match *step {
                trace::Step::Alloc { id, size, stream } => {
                    live.insert(id, pool.malloc(size, keys[stream], &cache).unwrap());
                }
                trace::Step::Free { id } => drop(live.remove(&id)),
            }
        }
        drop(live);
        gpumem::Device::current().synchronize().unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let driver_ms = (counts.driver_ns.load(Ordering::Relaxed) - driver_before) as f64 / 1e6;
        let in_steps = per_step.finish(calls());
        let (allocs, frees, _, peak) = counts.snapshot();
        let ratio = peak as f64 / trace::peak_in_use(steps) as f64;
        let across = pool.stats().all.lent_across_streams;
        drop(pool);
        drop(streams);
        Replayed { ratio, allocs, frees, in_steps, ms, driver_ms, across }
    }
    let Setup { policy, raw, share } = setup;
    match raw {
        Raw::Plain => run(steps, marks, policy, Counting::new(DeviceAllocator::new()), share),
        Raw::Expandable => {
            // A quarter of the device per block at most: the host backend's reserved ranges are
            // host address space, which the operating system may refuse in one piece.
            let total = gpumem::Device::current().properties().unwrap().total_memory;
            let inner =
                ExpandableAllocator::<B>::new(dev(), expandable::DEFAULT_RESERVE.min(total / 4)).unwrap();
            run(steps, marks, policy, Counting::new(Arc::new(inner)), share)
        }
        Raw::Stitching => {
            let total = gpumem::Device::current().properties().unwrap().total_memory;
            let inner =
                ExpandableAllocator::<B>::stitching(dev(), expandable::DEFAULT_RESERVE.min(total / 4))
                    .unwrap();
            run(steps, marks, policy, Counting::new(Arc::new(inner)), share)
        }
    }
}

/// One warm-up replay, then `REPLAYS` timed ones: the median time; the counts and the ratio of
/// the first timed one (every replay starts from an empty pool, so they are the same each time).
pub(crate) fn replay(steps: &[trace::Step], marks: &[usize], setup: Setup) -> Replayed {
    const REPLAYS: usize = 5;
    replay_once(steps, marks, setup);
    let runs: Vec<Replayed> = (0..REPLAYS).map(|_| replay_once(steps, marks, setup)).collect();
    let ms = median(&mut runs.iter().map(|r| r.ms).collect::<Vec<_>>());
    let driver_ms = median(&mut runs.iter().map(|r| r.driver_ms).collect::<Vec<_>>());
    Replayed { ms, driver_ms, ..runs[0].clone() }
}

/// The traces the fragmentation rows replay: the random one, and those `bench/run-gpu.sh`
/// recorded (`training.trace`: GPT-2, `bert.trace`: BERT fine-tuning) when present.
/// Each with the indices where its second and third training steps begin, if it marks them.
pub(crate) fn traces(dir: Option<&str>) -> Vec<(&'static str, Vec<trace::Step>, Vec<usize>)> {
    let random = trace::standard_random();
    let mut traces = vec![
        ("random_one_stream", trace::on_one_stream(&random), Vec::new()),
        ("random", random, Vec::new()),
    ];
    for name in ["training", "bert"] {
        let Some(text) = dir.and_then(|d| std::fs::read_to_string(format!("{d}/{name}.trace")).ok()) else {
            continue;
        };
        match trace::parse(&text) {
            Ok(steps) => traces.push((name, steps, later_steps(&text))),
            Err(e) => eprintln!("  {name} trace unreadable: {e}"),
        }
    }
    traces
}

/// Where a recorded training trace's second and third steps begin (its second and third `# step`
/// marks; fewer when it has fewer): the step in which the optimizer's state first lives beside
/// the activations (a peak the first step never reached), and the steps after it, in which a loop
/// that settles makes no raw call.
pub(crate) fn later_steps(text: &str) -> Vec<usize> {
    trace::step_marks(text).into_iter().skip(1).take(2).collect()
}

/// gpumem's configurations: (label, policy, raw allocator, memory shared across streams).
pub(crate) const POLICIES: [(&str, GrowthPolicy, Raw, bool); 7] = [
    ("gpumem, CuPy's rules", GrowthPolicy::CacheUntilOutOfMemory, Raw::Plain, false),
    ("gpumem, HoldPeakInUse", GrowthPolicy::HoldPeakInUse, Raw::Plain, false),
    ("gpumem, Segments", GrowthPolicy::Segments, Raw::Plain, false),
    (
        "gpumem, CuPy's rules, expandable segments",
        GrowthPolicy::CacheUntilOutOfMemory,
        Raw::Expandable,
        false,
    ),
    ("gpumem, Segments, expandable segments", GrowthPolicy::Segments, Raw::Expandable, false),
    ("gpumem, Segments, expandable, shared across streams", GrowthPolicy::Segments, Raw::Expandable, true),
    ("gpumem, Segments, stitching", GrowthPolicy::Segments, Raw::Stitching, false),
];

/// The anchors' rows: (label, key prefix in anchors.txt).
pub(crate) const FRAG_ANCHORS: [(&str, &str); 3] = [
    ("PyTorch caching allocator, default", "torch_default"),
    ("PyTorch, expandable_segments:True", "torch_expandable"),
    ("CuPy MemoryPool", "cupy"),
];

/// The fragmentation table: every allocator on every trace, with what its ratio cost. Also adds
/// the Segments policy's rows against the targets and PyTorch's default to the report.
pub(crate) fn fragmentation(report: &mut Report, dir: Option<&str>) -> String {
    eprintln!("fragmentation: peak held / peak in use, raw calls, replay time (median of 5 after a warm-up)");
    let mut table = String::new();
    writeln!(
        table,
        "| trace | allocator | held / in use | raw allocations | raw frees | raw calls in step 2 | from step 3 on | replay | of it in the driver |"
    )
    .unwrap();
    writeln!(table, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |").unwrap();
    for (name, steps, marks) in traces(dir) {
        let label = format!("{} ({} steps)", name.replace('_', " "), steps.len());
        let mut ours = Vec::new();
        for (what, policy, raw, share) in POLICIES {
            if raw != Raw::Plain && !<B as gpumem::core::Api>::CAPS.virtual_memory {
                continue;
            }
            let r = replay(&steps, &marks, Setup { policy, raw, share });
            let step = |k: usize| r.in_steps.get(k).map_or("-".into(), usize::to_string);
            let (second, later) = (step(0), step(1));
            eprintln!(
                "  {label:<22} {what:<36} {:.3}  {:>5} allocs {:>5} frees {second:>5} in step 2 {later:>5} after {:>9.2} ms ({:.2} ms in the driver)  {} lent across streams",
                r.ratio, r.allocs, r.frees, r.ms, r.driver_ms, r.across
            );
            writeln!(
                table,
                "| {label} | {what} | {:.3} | {} | {} | {second} | {later} | {:.1} ms | {:.1} ms |",
                r.ratio, r.allocs, r.frees, r.ms, r.driver_ms
            )
            .unwrap();
            ours.push((policy, raw, share, r));
        }
        for (what, key) in FRAG_ANCHORS {
            let get = |field: &str| report.external(&format!("{key}_frag_{name}_{field}"));
            let Some(ratio) = get("ratio") else {
                writeln!(table, "| {label} | {what} | - | - | - | - | - | - | - |").unwrap();
                continue;
            };
            let count = |field: &str| get(field).map_or("-".into(), |v| format!("{v:.0}"));
            let ms = get("ms").map_or("-".into(), |v| format!("{v:.1} ms"));
            writeln!(
                table,
                "| {label} | {what} | {ratio:.3} | {} | {} | {} | {} | {ms} | not reported |",
                count("allocs"),
                count("frees"),
                count("in_step2"),
                count("from_step3")
            )
            .unwrap();
        }
        let target = if name.starts_with("random") { 1.05 } else { 1.03 };
        let anchors = report.anchors.clone();
        let torch = |field: &str| anchors.get(&format!("torch_default_frag_{name}_{field}")).copied();
        for (policy_name, raw, share) in [
            ("Segments", Raw::Plain, false),
            ("Segments + expandable segments", Raw::Expandable, false),
            ("Segments + expandable segments, shared across streams", Raw::Expandable, true),
        ] {
            let Some((_, _, _, seg)) =
                ours.iter().find(|(p, r, s, _)| *p == GrowthPolicy::Segments && *r == raw && *s == share)
            else {
                continue;
            };
            let what = |m: &str| format!("{label}, {policy_name}, {m}");
            report.add(
                "fragmentation",
                what("held / in use"),
                seg.ratio,
                "target",
                Some(target),
                "ratio",
                true,
            );
            report.add(
                "fragmentation",
                what("held / in use"),
                seg.ratio,
                "PyTorch caching allocator",
                torch("ratio"),
                "ratio",
                true,
            );
            report.add(
                "fragmentation",
                what("raw allocations"),
                seg.allocs as f64,
                "PyTorch caching allocator",
                torch("allocs"),
                "calls",
                true,
            );
            report.add(
                "fragmentation",
                what("replay"),
                seg.ms,
                "PyTorch caching allocator",
                torch("ms"),
                "ms",
                true,
            );
        }
    }
    table.push('\n');
    table.push_str(&seed_table(report));
    table
}

/// The median of an even count too: the mean of the middle two.
pub(crate) fn middle(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// The random trace drawn from `seed`, on one stream: what the seed table replays.
pub(crate) fn seed_steps(seed: u64) -> Vec<trace::Step> {
    trace::on_one_stream(&trace::random_seeded(seed))
}

/// How a host replay sets up its pool for one of gpumem's configurations, counting raw calls
/// from each of `marks` on.
fn replay_options(raw: Raw, share: bool, marks: &[usize]) -> trace::ReplayOptions {
    trace::ReplayOptions {
        expandable: raw == Raw::Expandable,
        stitch: raw == Raw::Stitching,
        share_across_streams: share,
        marks: marks.to_vec(),
        ..trace::ReplayOptions::default()
    }
}

/// The host replay of `steps` (no device: ratio and raw calls depend only on the pool's rules and
/// the trace) with each of `policies`, a line each, after `prefix`.
pub(crate) fn print_host_replays(
    prefix: &str,
    steps: &[trace::Step],
    marks: &[usize],
    policies: &[(&str, GrowthPolicy, Raw, bool)],
) {
    for &(what, policy, raw, share) in policies {
        let r = trace::replay_with(steps, policy, replay_options(raw, share, marks)).expect("replay");
        let step = |k: usize| r.raw_calls_in_steps.get(k).map_or("-".into(), usize::to_string);
        let (second, later) = (step(0), step(1));
        println!(
            "{prefix}{what:<52} held / in use {:.4}  raw allocations {:>5}  raw frees {:>5}  in step 2 {second:>4}  from step 3 {later:>4}  lent across streams {:>5}  driver calls {:>5}",
            r.ratio(),
            r.raw_allocs,
            r.raw_frees,
            r.lent_across_streams,
            r.driver_calls
        );
    }
}

/// The random trace on one stream from seeds 1 to `n` through the pool alone (no device), each
/// policy of [`POLICIES`] that keeps streams apart: the spread of held over in use (mean, median,
/// least, most), the mean of the raw allocations, and where the standard seed's figure ranks
/// among the seeds'. One seed's figure is one draw: it depends on where the few largest requests
/// fall among the holes of the moment.
pub(crate) fn print_seed_sweep(n: u64) {
    let standard = trace::on_one_stream(&trace::standard_random());
    println!("random trace on one stream, seeds 1 to {n}: held / in use, and raw allocations");
    for &(what, policy, raw, share) in POLICIES.iter().filter(|p| !p.3) {
        let replay = |steps: &[trace::Step]| {
            trace::replay_with(steps, policy, replay_options(raw, share, &[])).expect("replay")
        };
        let runs: Vec<trace::ReplayStats> = (1..=n).map(|seed| replay(&seed_steps(seed))).collect();
        let mut ratios: Vec<f64> = runs.iter().map(trace::ReplayStats::ratio).collect();
        let allocs = runs.iter().map(|r| r.raw_allocs).sum::<usize>() as f64 / runs.len() as f64;
        let calls = runs.iter().map(|r| r.driver_calls).sum::<usize>() as f64 / runs.len() as f64;
        let ours = replay(&standard).ratio();
        let below = ratios.iter().filter(|&&r| r < ours).count();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        ratios.sort_by(f64::total_cmp);
        let (least, most) = (ratios[0], ratios[ratios.len() - 1]);
        println!(
            "{what:<42} mean {mean:.4}  median {:.4}  least {least:.4}  most {most:.4}  raw allocations {allocs:>7.1}  driver calls {calls:>7.1}  standard seed {ours:.4} (below it: {below} of {n})",
            median(&mut ratios),
        );
    }
}

/// The name of the trace of seed `seed`: its key in anchors.txt and its file, with `.trace`.
pub(crate) fn seed_trace(seed: u64) -> String {
    format!("random_seed{seed}")
}

/// The random trace on one stream drawn from each of [`trace::OTHER_SEEDS`]: what each
/// allocator holds over the peak in use and its raw allocations, seed by seed, with the median
/// of each column (the figure on the standard seed is read beside these). Adds gpumem's median
/// against PyTorch's to the report.
pub(crate) fn seed_table(report: &mut Report) -> String {
    let mut table = String::new();
    let anchors: Vec<&str> = FRAG_ANCHORS.iter().map(|a| a.0).collect();
    writeln!(
        table,
        "| random trace, one stream, seed | gpumem, Segments, expandable segments | gpumem, Segments | {} |",
        anchors.join(" | ")
    )
    .unwrap();
    writeln!(table, "|{}", " --- |".repeat(3 + anchors.len())).unwrap();
    let ours = [(Raw::Expandable, 0), (Raw::Plain, 1)];
    let mut columns: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ours.len() + FRAG_ANCHORS.len()];
    for seed in trace::OTHER_SEEDS {
        let steps = seed_steps(seed);
        let mut cells = Vec::new();
        for (raw, column) in ours {
            if raw != Raw::Plain && !<B as gpumem::core::Api>::CAPS.virtual_memory {
                cells.push("-".to_owned());
                continue;
            }
            let r = replay(&steps, &[], Setup { policy: GrowthPolicy::Segments, raw, share: false });
            columns[column].push((r.ratio, r.allocs as f64));
            cells.push(format!("{:.3} ({} raw)", r.ratio, r.allocs));
        }
        for (i, (_, key)) in FRAG_ANCHORS.iter().enumerate() {
            let get = |field: &str| report.external(&format!("{key}_frag_{}_{field}", seed_trace(seed)));
            match (get("ratio"), get("allocs")) {
                (Some(ratio), Some(allocs)) => {
                    columns[ours.len() + i].push((ratio, allocs));
                    cells.push(format!("{ratio:.3} ({allocs:.0} raw)"));
                }
                _ => cells.push("-".to_owned()),
            }
        }
        eprintln!("  random trace, one stream, seed {seed}: {}", cells.join(", "));
        writeln!(table, "| {seed} | {} |", cells.join(" | ")).unwrap();
    }
    let medians: Vec<Option<(f64, f64)>> = columns
        .iter()
        .map(|c| {
            (c.len() == trace::OTHER_SEEDS.len()).then(|| {
                let ratios: Vec<f64> = c.iter().map(|x| x.0).collect();
                let allocs: Vec<f64> = c.iter().map(|x| x.1).collect();
                (middle(ratios), middle(allocs))
            })
        })
        .collect();
    let cells: Vec<String> =
        medians.iter().map(|m| m.map_or("-".into(), |(r, a)| format!("{r:.3} ({a:.1} raw)"))).collect();
    writeln!(table, "| median | {} |", cells.join(" | ")).unwrap();
    let torch = medians[ours.len()];
    if let Some((ratio, allocs)) = medians[0] {
        let what = format!(
            "random trace, one stream, median of {} other seeds, Segments + expandable segments",
            trace::OTHER_SEEDS.len()
        );
        report.add(
            "fragmentation",
            format!("{what}, held / in use"),
            ratio,
            "PyTorch caching allocator",
            torch.map(|t| t.0),
            "ratio",
            true,
        );
        report.add(
            "fragmentation",
            format!("{what}, raw allocations"),
            allocs,
            "PyTorch caching allocator",
            torch.map(|t| t.1),
            "calls",
            true,
        );
    }
    table
}
