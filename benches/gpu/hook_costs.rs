//! What hooks cost on the cache hit, and the arena lock against parking_lot's.

use std::hint::black_box;
use std::io::BufWriter;
use std::sync::Arc;

use gpumem::{hooks, DebugPrintHook, SingleDeviceMemoryPool};

use crate::report::Report;
use crate::threads::median_rate;
use crate::threads::Streams;
use crate::timing::{bench_cpu, dev, median, ns_per_iter, on_bench_cpu, placed_pools, PLACEMENTS};

pub(crate) fn hook_costs(report: &mut Report) {
    eprintln!("hooks (the hit with and without DebugPrintHook on CPU {})", bench_cpu());
    // The hooked and unhooked hits on the single-thread rows' CPU, in the allocation rows' heap
    // placements (`placed_pools`), pool by pool and round by round (the hook installed for
    // every other measurement), so that neither a move to another CPU, a drifting clock nor a
    // slow placement falls on one of them alone. Each pool's figures are the median of 3 rounds
    // of 100,000 pairs; the rows give the median over the pools of each, and of each pool's
    // hooked over unhooked.
    let (bare, with_hook, hooked_over_bare) = on_bench_cpu(|| {
        let (pools, pads) = placed_pools(&[512]);
        let (mut bare, mut hooked) = (vec![Vec::new(); PLACEMENTS], vec![Vec::new(); PLACEMENTS]);
        for _ in 0..3 {
            for (k, pool) in pools.iter().enumerate() {
                let hit = || drop(black_box(pool.malloc_pooled(black_box(512)).unwrap()));
                bare[k].push(ns_per_iter(1, 100_000, hit));
                let hook = hooks::install(DebugPrintHook::with_flush(BufWriter::new(std::io::sink()), false))
                    .unwrap();
                hooked[k].push(ns_per_iter(1, 100_000, hit));
                drop(hook);
            }
        }
        drop(pools);
        drop(pads);
        let mut bare: Vec<f64> = bare.iter_mut().map(|r| median(r)).collect();
        let mut hooked: Vec<f64> = hooked.iter_mut().map(|r| median(r)).collect();
        let mut ratios: Vec<f64> = hooked.iter().zip(&bare).map(|(h, b)| h / b).collect();
        let each: Vec<String> = bare.iter().zip(&hooked).map(|(b, h)| format!("{b:.1}/{h:.1}")).collect();
        eprintln!("  unhooked/hooked ns in each of {PLACEMENTS} heap placements: {}", each.join(" "));
        (median(&mut bare), median(&mut hooked), median(&mut ratios))
    });
    let pool = SingleDeviceMemoryPool::new(dev()).unwrap();
    drop(pool.malloc_pooled(512).unwrap());
    // Two events (malloc, free) per cache-hit pair.
    let events_per_s = 2.0 / (with_hook * 1e-9) / 1e6;
    report.add(
        "hooks",
        "DebugPrintHook into a buffered writer",
        events_per_s,
        "CuPy DebugPrintHook",
        report.external("cupy_debugprint_mevents"),
        "M ev/s",
        false,
    );
    report.add(
        "hooks",
        "cache hit, DebugPrintHook installed",
        with_hook,
        "cache hit, no hook",
        Some(bare),
        "ns",
        true,
    );
    // The process-wide recorder: every thread's operations, one lock per line.
    let recorder = gpumem::Recorder::new(BufWriter::new(std::io::sink())).install();
    let recorded = ns_per_iter(9, 200_000, || drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())));
    drop(recorder);
    report.add(
        "hooks",
        "cache hit, process-wide Recorder installed",
        recorded,
        "cache hit, no hook",
        Some(bare),
        "ns",
        true,
    );
    // Reading the statistics (each arena's lock once) and the summary table.
    let stats = ns_per_iter(9, 20_000, || drop(black_box(pool.stats())));
    report.add("hooks", "pool.stats(), one arena", stats, "cache hit, no hook", Some(bare), "ns", true);
    report.add(
        "hooks",
        "hooked cache hit over the unhooked one",
        hooked_over_bare,
        "target",
        Some(2.5),
        "x",
        true,
    );
    // The hook machinery's cost when no hook is installed: the check alone.
    let check = ns_per_iter(9, 10_000_000, || {
        black_box(hooks::active());
    });
    report.add("hooks", "hook check with no hook installed", check, "target", Some(2.0), "ns", true);
}

/// The arena lock this binary was built with (`pool::ARENA_LOCK`: the hand-written
/// spin-then-yield lock, or parking_lot's raw mutex with `--features parking-lot-arena-lock`):
/// a cache hit on one thread, and eight threads sharing the null stream's arena, in alternating
/// rounds. Two builds run one after the other compare the locks (`bench/run-gpu.sh` runs both
/// when it finds the second).
pub(crate) fn arena_lock(report: &mut Report) {
    let lock = gpumem::core::pool::ARENA_LOCK;
    eprintln!("arena lock: {lock}");
    let pool = Arc::new(SingleDeviceMemoryPool::new(dev()).unwrap());
    // Both arenas measured below: this thread's current stream's and the null stream's (a thread
    // that enters no stream).
    drop(pool.malloc_pooled(512).unwrap());
    let p = Arc::clone(&pool);
    std::thread::spawn(move || drop(p.malloc_pooled(4096).unwrap())).join().unwrap();
    let (mut hit, mut shared) = (vec![], vec![]);
    for _ in 0..3 {
        hit.push(ns_per_iter(9, 200_000, || drop(black_box(pool.malloc_pooled(black_box(512)).unwrap()))));
        let p = Arc::clone(&pool);
        shared.push(median_rate(8, 100_000, Streams::Null, None, move |_, iters| {
            for _ in 0..iters {
                drop(black_box(p.malloc_pooled(black_box(4096)).unwrap()));
            }
        }));
    }
    report.add("arena lock", format!("cache hit, {lock} lock"), median(&mut hit), "", None, "ns", true);
    report.add(
        "arena lock",
        format!("8 threads on the null stream, {lock} lock"),
        median(&mut shared),
        "",
        None,
        "M pairs/s",
        false,
    );
}

// HIP has no graphs: its graph type is uninhabited, so the code after capture is unreachable
// there (and the function returns early at run time anyway).
