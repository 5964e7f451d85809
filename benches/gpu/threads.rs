//! Threads on streams of their own, threads sharing the null stream, and a loop sharing nothing,
//! measured in the same run.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpumem::core::pool::ArenaKey;
use gpumem::core::MemoryOps;
use gpumem::{DefaultBackend as B, SingleDeviceMemoryPool, Stream};

use crate::report::{fmt, Report};
use crate::timing::{dev, median, on_host};

/// Where the threads of [`threads_rate`] allocate.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Streams {
    /// Each thread on a non-blocking stream it makes, so its arena is made by its own first
    /// allocation.
    Own,
    /// Each thread on a non-blocking stream made on the calling thread, whose arena the calling
    /// thread made too (an allocation there): every arena's memory comes from one thread's heap,
    /// side by side, as when a program makes its streams up front.
    MadeUpFront,
    /// Every thread on the null stream (one arena, until threads that keep waiting for its lock
    /// move to lanes of their own).
    Null,
    /// Every thread on one non-blocking stream made on the calling thread (as the null stream).
    OneShared,
}

/// Aggregate operations per second (millions) of `threads` threads placed as `streams` says,
/// thread `i` pinned to `cpus[i]` when `cpus` is given (it has a CPU for every thread): `run`
/// does `iters` operations on the calling thread; the rate is the total over the slowest
/// thread's time.
pub(crate) fn threads_rate(
    threads: usize,
    iters: u64,
    streams: Streams,
    cpus: Option<&[core_affinity::CoreId]>,
    run: impl Fn(Option<&Stream>, u64) + Send + Sync + 'static,
) -> f64 {
    let run = Arc::new(run);
    let start = Arc::new(Barrier::new(threads + 1));
    let shared = (streams == Streams::OneShared).then(|| Stream::non_blocking().unwrap());
    let made: Vec<Option<Stream>> = (0..threads)
        .map(|_| {
            if let Some(s) = &shared {
                return Some(s.clone());
            }
            (streams == Streams::MadeUpFront).then(|| {
                let s = Stream::non_blocking().unwrap();
                let _g = s.enter().unwrap();
                run(Some(&s), 1);
                s
            })
        })
        .collect();
    let handles: Vec<_> = made
        .into_iter()
        .enumerate()
        .map(|(i, made)| {
            let (run, start) = (Arc::clone(&run), Arc::clone(&start));
            let cpu = cpus.and_then(|c| c.get(i).copied());
            std::thread::spawn(move || {
                if let Some(cpu) = cpu {
                    assert!(core_affinity::set_for_current(cpu), "pin to CPU {}", cpu.id);
                }
                let stream =
                    made.or_else(|| (streams == Streams::Own).then(|| Stream::non_blocking().unwrap()));
                let _g = stream.as_ref().map(|s| s.enter().unwrap());
                run(stream.as_ref(), iters / 10);
                start.wait();
                let t = Instant::now();
                run(stream.as_ref(), iters);
                let elapsed = t.elapsed();
                if let Some(s) = &stream {
                    s.synchronize().unwrap();
                }
                elapsed
            })
        })
        .collect();
    start.wait();
    let slowest = handles.into_iter().map(|h| h.join().unwrap()).max().unwrap();
    (threads as f64 * iters as f64) / slowest.as_secs_f64() / 1e6
}

/// Work that shares nothing between threads and touches no memory: a xorshift step per
/// iteration, about as long as a cache hit. Its scaling is what the machine gives (a clock that
/// drops as cores wake, hyperthreads sharing a core); the allocator's scaling is read against it.
pub(crate) fn parallel_loop(iters: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ black_box(iters);
    for _ in 0..iters {
        for _ in 0..24 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        x = black_box(x);
    }
}

/// The machine's CPUs in the order [`threads`] pins its threads: one CPU of each core first
/// (cores told apart by `/sys/devices/system/cpu/cpuN/topology`'s package and core ids), then
/// the cores' other hardware threads. Eight threads pinned so run on eight cores wherever the
/// machine has them, however the scheduler would have placed them. Also the count of cores
/// (`None` where the topology cannot be read).
fn cpus_by_core() -> (Vec<core_affinity::CoreId>, Option<usize>) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let read = |cpu: usize, what: &str| -> Option<u32> {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    let cores: Option<Vec<(u32, u32)>> =
        ids.iter().map(|c| Some((read(c.id, "physical_package_id")?, read(c.id, "core_id")?))).collect();
    let Some(cores) = cores else { return (ids, None) };
    let mut seen = std::collections::HashSet::new();
    let (first, rest): (Vec<_>, Vec<_>) = ids.iter().zip(&cores).partition(|(_, core)| seen.insert(**core));
    let order = first.iter().chain(&rest).map(|(id, _)| **id).collect();
    (order, Some(seen.len()))
}

/// The median of 5 runs of [`threads_rate`].
pub(crate) fn median_rate(
    threads: usize,
    iters: u64,
    streams: Streams,
    cpus: Option<&[core_affinity::CoreId]>,
    run: impl Fn(Option<&Stream>, u64) + Clone + Send + Sync + 'static,
) -> f64 {
    median(&mut (0..5).map(|_| threads_rate(threads, iters, streams, cpus, run.clone())).collect::<Vec<_>>())
}

pub(crate) fn threads(report: &mut Report) {
    eprintln!("threads, 4 KiB allocate + free (M pairs/s, aggregate), beside a loop that shares nothing");
    let pool = Arc::new(SingleDeviceMemoryPool::new(dev()).unwrap());
    let pooled = {
        let p = Arc::clone(&pool);
        move |_: Option<&Stream>, iters: u64| {
            for _ in 0..iters {
                drop(black_box(p.malloc_pooled(black_box(4096)).unwrap()));
            }
        }
    };
    let pointers = {
        let p = Arc::clone(&pool);
        move |_: Option<&Stream>, iters: u64| {
            for _ in 0..iters {
                drop(black_box(p.malloc(black_box(4096)).unwrap()));
            }
        }
    };
    // What threads could still share, each taken away in turn: the pool (each thread its own),
    // and where the arenas' memory lies (made by each thread, or all by one thread up front).
    let own_pools = |_: Option<&Stream>, iters: u64| {
        thread_local!(static POOL: SingleDeviceMemoryPool = SingleDeviceMemoryPool::new(dev()).unwrap());
        POOL.with(|p| {
            for _ in 0..iters {
                drop(black_box(p.malloc_pooled(black_box(4096)).unwrap()));
            }
        });
    };
    // The system allocator's 4 KiB allocate + free: a heap whose threads share nothing either
    // (glibc gives each thread an arena of its own), touching memory as a cache hit does.
    let system = |_: Option<&Stream>, iters: u64| {
        let layout = std::alloc::Layout::from_size_align(4096, 16).unwrap();
        for _ in 0..iters {
            // SAFETY: the layout's size is not zero; the block is freed with the same layout.
            unsafe {
                let p = std::alloc::alloc(black_box(layout));
                assert!(!p.is_null());
                std::alloc::dealloc(black_box(p), layout);
            }
        }
    };
    // The same rows with each thread pinned, one per core first: where the scheduler puts two
    // busy threads on one core's hardware threads, both slow down, and the unpinned rows read
    // that as the allocator's.
    let (order, cores) = cpus_by_core();
    match cores {
        Some(c) => {
            eprintln!("  {} CPUs on {c} cores; pinned rows take one CPU of each core first", order.len())
        }
        None => eprintln!("  {} CPUs, cores unknown; pinned rows take them in order", order.len()),
    }
    let (mut single, mut single_loop, mut single_null, mut single_system) = (0.0, 0.0, 0.0, 0.0);
    let (mut single_pinned, mut single_loop_pinned) = (0.0, 0.0);
    for n in [1usize, 4, 8] {
        // The loop first and last around gpumem's figure, so a clock that drifts during the run
        // shows in their difference.
        let loop_before = median_rate(n, 2_000_000, Streams::Own, None, |_, iters| parallel_loop(iters));
        let ours = median_rate(n, 2_000_000, Streams::Own, None, pooled.clone());
        let ptrs = median_rate(n, 2_000_000, Streams::Own, None, pointers.clone());
        let null = median_rate(n, 2_000_000, Streams::Null, None, pooled.clone());
        // The null stream's arenas after its runs: threads that kept waiting for its lock moved to
        // lanes of their own.
        let null_arenas =
            pool.stats().arenas.iter().filter(|a| a.arena.stream_key() == ArenaKey::NULL).count();
        let one = median_rate(n, 2_000_000, Streams::OneShared, None, pooled.clone());
        let own = median_rate(n, 2_000_000, Streams::Own, None, own_pools);
        let up_front = median_rate(n, 2_000_000, Streams::MadeUpFront, None, pooled.clone());
        let sys = median_rate(n, 2_000_000, Streams::Own, None, system);
        let loop_after = median_rate(n, 2_000_000, Streams::Own, None, |_, iters| parallel_loop(iters));
        let looped = (loop_before + loop_after) / 2.0;
        let cpus = order.get(..n);
        let loop_pinned = median_rate(n, 2_000_000, Streams::Own, cpus, |_, iters| parallel_loop(iters));
        let pinned = median_rate(n, 2_000_000, Streams::Own, cpus, pooled.clone());
        if n == 1 {
            (single, single_loop, single_null, single_system) = (ours, looped, null, sys);
            (single_pinned, single_loop_pinned) = (pinned, loop_pinned);
        }
        let anchor =
            threads_rate(n, if on_host() { 1_000 } else { 100_000 }, Streams::Own, None, |s, iters| {
                let h = s.expect("own stream").handle();
                for _ in 0..iters {
                    // SAFETY: `s` is alive for the loop, so its handle is.
                    let Ok(ptr) = (unsafe { B::malloc_async(dev(), 4096, h) }) else { return };
                    // SAFETY: just allocated on `h`, unused.
                    unsafe { B::free_async(dev(), ptr, h).unwrap() };
                }
            });
        let label = format!("{n} thread(s)");
        let anchors = [
            ("cuMemAllocAsync, same threads", Some(anchor)),
            ("PyTorch caching allocator (C++)", report.external(&format!("torch_cpp_threads_{n}"))),
            ("CuPy MemoryPool (Python)", report.external(&format!("cupy_threads_{n}"))),
        ];
        for (name, value) in anchors {
            report.add("threads", label.clone(), ours, name, value, "M/s", false);
        }
        // gpumem's variants, each against the pool's own path on streams of their own.
        let variants = [
            ("MemoryPointer".to_owned(), ptrs, "pool's own path, same threads"),
            (format!("all on the null stream ({null_arenas} of its arenas so far)"), null, "own streams"),
            ("all on one stream they share".to_owned(), one, "own streams"),
            ("each its own pool".to_owned(), own, "one pool"),
            ("streams and arenas made up front on one thread".to_owned(), up_front, "each thread's own"),
        ];
        for (variant, value, against) in variants {
            report.add("threads", format!("{label}, {variant}"), value, against, Some(ours), "M/s", false);
        }
        report.add(
            "threads",
            format!("{label}, the system allocator (4 KiB alloc + dealloc)"),
            sys,
            "-",
            None,
            "M/s",
            false,
        );
        let placed = if cpus.is_some() { "pinned, one per core first" } else { "too few CPUs to pin" };
        report.add("threads", format!("{label}, {placed}"), pinned, "unpinned", Some(ours), "M/s", false);
        report.add(
            "threads",
            format!("{label}, loop sharing nothing, {placed}"),
            loop_pinned,
            "-",
            None,
            "M it/s",
            false,
        );
        report.add(
            "threads",
            format!(
                "{label}, loop sharing nothing (before / after: {} / {})",
                fmt(loop_before),
                fmt(loop_after)
            ),
            looped,
            "-",
            None,
            "M it/s",
            false,
        );
        if n > 1 {
            let target = if n == 4 { 3.5 } else { 6.5 };
            let scalings = [
                ("target", target),
                ("the loop sharing nothing, its scaling", looped / single_loop),
                ("the system allocator's scaling", sys / single_system),
            ];
            for (name, value) in scalings {
                let label = format!("{n} threads over 1 thread (scaling)");
                report.add("threads", label, ours / single, name, Some(value), "x", false);
            }
            // Without a CPU for each thread nothing was pinned: no pinned scaling to show.
            if cpus.is_some() {
                let label = format!("{n} threads over 1 thread, pinned one per core first (scaling)");
                let loop_scaling = loop_pinned / single_loop_pinned;
                for (name, value) in
                    [("target", target), ("the loop sharing nothing, pinned, its scaling", loop_scaling)]
                {
                    report.add(
                        "threads",
                        label.clone(),
                        pinned / single_pinned,
                        name,
                        Some(value),
                        "x",
                        false,
                    );
                }
            }
            report.add(
                "threads",
                format!("{n} threads on the null stream over 1 thread on it (scaling)"),
                null / single_null,
                "target (own streams)",
                Some(target),
                "x",
                false,
            );
        }
    }
}
