//! gpumem against what users would pick instead, measured side by side in one run.
//!
//! Each row has gpumem's figure, the anchor's figure from the same run, and their ratio. The
//! anchors that run in this program go through the same backend's raw calls (`cuMemAllocAsync`,
//! `cuMemAlloc`, `cuMemcpyAsync`, captured driver calls). PyTorch's and CuPy's figures come from
//! `bench/anchors.py` (PyTorch's C++ allocator through an inline extension), run just before on
//! the same machine; point `GPUMEM_BENCH_DIR` at the folder they wrote (`bench/run-gpu.sh` does
//! all of it). The single-thread allocation rows and those anchors run on one CPU,
//! `GPUMEM_BENCH_CPU` (3 unless set), as CPUs differ in speed; `GPUMEM_BENCH_ONLY=allocation,...`
//! runs only the sections named.
//!
//! ```text
//! cargo bench --features cuda --bench gpu                  # on an NVIDIA GPU
//! cargo bench --bench gpu                                  # the same program on the host backend
//! cargo bench --bench gpu -- --write-trace random.trace    # the random trace, for the anchors
//! cargo bench --bench gpu -- --write-seeds DIR              # the other seeds' traces, for them
//! cargo bench --bench gpu -- --replay-host TRACE            # gpumem's figures without a device
//! cargo bench --bench gpu -- --replay-seeds                 # the same for every other seed
//! ```
//!
//! Nothing here asserts a timing: the output is a report.

#![allow(missing_docs)]

use gpumem::core::pool::expandable::{self, ExpandableAllocator};
use gpumem::core::pool::trace;
use gpumem::core::{ArenaKey, RawBlock};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::io::{BufWriter, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpumem::core::{GraphOps, MemoryOps, StreamOps};
use gpumem::{
    hooks, DebugPrintHook, DefaultBackend as B, DeviceAllocator, DeviceId, GrowthPolicy, MemoryPointer,
    PinnedMemoryPointer, RawAllocator, SingleDeviceMemoryPool, Stream,
};

type Anchors = HashMap<String, f64>;

/// One line of the report.
struct Row {
    section: &'static str,
    what: String,
    gpumem: f64,
    anchor_name: String,
    anchor: Option<f64>,
    unit: &'static str,
    /// Whether lower is better (times, ratios of memory) or higher (rates).
    lower_is_better: bool,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        let a = self.anchor?;
        Some(if self.lower_is_better { a / self.gpumem } else { self.gpumem / a })
    }
}

struct Report {
    rows: Vec<Row>,
    anchors: Anchors,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        gpumem: f64,
        anchor_name: impl Into<String>,
        anchor: Option<f64>,
        unit: &'static str,
        lower_is_better: bool,
    ) {
        let row = Row {
            section,
            what: what.into(),
            gpumem,
            anchor_name: anchor_name.into(),
            anchor,
            unit,
            lower_is_better,
        };
        eprintln!(
            "  {:<14} {:<44} gpumem {:>12.3} {:<5} {:<34} {:>12} {}",
            row.section,
            row.what,
            row.gpumem,
            row.unit,
            row.anchor_name,
            row.anchor.map_or("-".into(), |a| format!("{a:.3}")),
            row.ratio().map_or("-".into(), |r| format!("x{r:.2}"))
        );
        self.rows.push(row);
    }

    fn external(&self, key: &str) -> Option<f64> {
        self.anchors.get(key).copied()
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        writeln!(s, "| section | measurement | gpumem | anchor | anchor's figure | gpumem's advantage |")
            .unwrap();
        writeln!(s, "| --- | --- | --- | --- | --- | --- |").unwrap();
        for r in &self.rows {
            writeln!(
                s,
                "| {} | {} | {} {} | {} | {} | {} |",
                r.section,
                r.what,
                fmt(r.gpumem),
                r.unit,
                r.anchor_name,
                r.anchor.map_or("-".into(), |a| format!("{} {}", fmt(a), r.unit)),
                r.ratio().map_or("-".into(), |x| format!("{x:.2}x"))
            )
            .unwrap();
        }
        s
    }
}

fn fmt(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// Nanoseconds per iteration of `f`, the median of `rounds` timed batches of `iters`.
fn ns_per_iter(rounds: usize, iters: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.min(1000) {
        f();
    }
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    median(&mut samples)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The host backend runs this program too, to check it; its anchors are slow and meaningless, so
/// they run fewer iterations.
fn on_host() -> bool {
    <B as gpumem::core::Api>::NAME == "host"
}

fn dev() -> DeviceId {
    gpumem::Device::current().id()
}

const SIZES: [(&str, usize); 3] = [("512 B", 512), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)];

/// The CPU the single-thread allocation rows run on, and `bench/anchors.py` runs PyTorch's and
/// CuPy's single-thread anchors on: `GPUMEM_BENCH_CPU`, 3 unless set. The GPU machine's CPUs run
/// the same code at different speeds (the same cache hit took 38 to 55 ns on four of them in one
/// call), so a ratio between two processes left on different CPUs would measure the CPUs.
fn bench_cpu() -> usize {
    match std::env::var("GPUMEM_BENCH_CPU") {
        Err(_) => 3,
        Ok(v) => {
            v.trim().parse().unwrap_or_else(|_| panic!("GPUMEM_BENCH_CPU must be a CPU number, not {v:?}"))
        }
    }
}

/// Runs `f` on a thread pinned to [`bench_cpu`] (on the calling thread, unpinned, where that
/// CPU does not exist, as on a small host machine).
fn on_bench_cpu<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let cpu = bench_cpu();
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let Some(&id) = ids.iter().find(|c| c.id == cpu) else {
        eprintln!("  (CPU {cpu} is not available here: not pinned)");
        return f();
    };
    std::thread::scope(|s| {
        s.spawn(move || {
            assert!(core_affinity::set_for_current(id), "pin to CPU {cpu}");
            f()
        })
        .join()
        .expect("the pinned run")
    })
}

fn allocation(report: &mut Report) {
    eprintln!("allocate + free, cache hit (ns per pair), on CPU {}", bench_cpu());
    let pool = SingleDeviceMemoryPool::new(dev()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let _g = stream.enter().unwrap();
    // gpumem's figures first, the three sizes interleaved round by round so that drifting clocks
    // treat them alike: the median of 11 rounds of 200,000 pairs each.
    let mut pooled: HashMap<usize, Vec<f64>> = HashMap::new();
    let mut pointer: HashMap<usize, Vec<f64>> = HashMap::new();
    for (_, size) in SIZES {
        drop(pool.malloc_pooled(size).unwrap());
    }
    for _ in 0..11 {
        for (_, size) in SIZES {
            let t = ns_per_iter(1, 200_000, || drop(black_box(pool.malloc_pooled(black_box(size)).unwrap())));
            pooled.entry(size).or_default().push(t);
            let t = ns_per_iter(1, 200_000, || drop(black_box(pool.malloc(black_box(size)).unwrap())));
            pointer.entry(size).or_default().push(t);
        }
    }
    for (name, size) in SIZES {
        let ours = median(pooled.get_mut(&size).unwrap());
        let ptr_path = median(pointer.get_mut(&size).unwrap());
        let h = stream.handle();
        // SAFETY: `stream` outlives every use of its handle `h` in this block.
        let async_anchor = if unsafe { B::malloc_async(dev(), size, h) }
            .and_then(|p| {
                // SAFETY: `p` was just allocated on `h` and nothing uses it.
                unsafe { B::free_async(dev(), p, h) }
            })
            .is_ok()
        {
            let t = ns_per_iter(9, if on_host() { 200 } else { 20_000 }, || {
                // The host backend frees when its stream thread reaches the free, which can lag
                // behind; a GPU reuses the memory at once. Wait for the stream if it lags.
                // SAFETY: `stream` is alive, so `h` is.
                let p = unsafe { B::malloc_async(dev(), black_box(size), h) }.unwrap_or_else(|_| {
                    // SAFETY: as above.
                    unsafe { B::stream_synchronize(dev(), h).unwrap() };
                    // SAFETY: as above.
                    unsafe { B::malloc_async(dev(), size, h).unwrap() }
                });
                // SAFETY: `p` was just allocated on `h` and nothing uses it.
                unsafe { B::free_async(dev(), p, h).unwrap() };
            });
            stream.synchronize().unwrap();
            Some(t)
        } else {
            None
        };
        let raw = ns_per_iter(5, 200, || {
            let p = B::malloc(dev(), black_box(size)).unwrap();
            // SAFETY: `p` was just allocated and nothing uses it.
            unsafe { B::free(dev(), p).unwrap() };
        });
        report.add(
            "allocation",
            format!("pool cache hit, {name}"),
            ours,
            "cuMemAllocAsync + cuMemFreeAsync",
            async_anchor,
            "ns",
            true,
        );
        report.add(
            "allocation",
            format!("pool cache hit, {name}"),
            ours,
            "cuMemAlloc + cuMemFree",
            Some(raw),
            "ns",
            true,
        );
        let key = format!("torch_cpp_ns_{size}");
        report.add(
            "allocation",
            format!("pool cache hit, {name}"),
            ours,
            "PyTorch caching allocator (C++)",
            report.external(&key),
            "ns",
            true,
        );
        let key = format!("cupy_ns_{size}");
        report.add(
            "allocation",
            format!("pool cache hit, {name}"),
            ours,
            "CuPy MemoryPool (Python)",
            report.external(&key),
            "ns",
            true,
        );
        report.add(
            "allocation",
            format!("MemoryPointer cache hit, {name}"),
            ptr_path,
            "PyTorch caching allocator (C++)",
            report.external(&format!("torch_cpp_ns_{size}")),
            "ns",
            true,
        );
        // The targets as rows: the pointer path within 1.3x of the pool's own (the advantage
        // column reads 1.00x or more when met), and the pool 15x ahead of each anchor.
        report.add(
            "allocation",
            format!("MemoryPointer over the pool's own path, {name}"),
            ptr_path / ours,
            "target",
            Some(1.3),
            "x",
            true,
        );
        let torch = report.external(&format!("torch_cpp_ns_{size}"));
        for (anchor, figure) in
            [("cuMemAllocAsync + cuMemFreeAsync", async_anchor), ("PyTorch caching allocator (C++)", torch)]
        {
            // Without the anchor in this run there is no ratio to show.
            let Some(figure) = figure else { continue };
            report.add(
                "allocation",
                format!("pool cache hit over {anchor}, {name}"),
                figure / ours,
                "target",
                Some(15.0),
                "x",
                false,
            );
        }
    }
}

/// Where the threads of [`threads_rate`] allocate.
#[derive(Clone, Copy, PartialEq)]
enum Streams {
    /// Each thread on a non-blocking stream it makes, so its arena is made by its own first
    /// allocation.
    Own,
    /// Each thread on a non-blocking stream made on the calling thread, whose arena the calling
    /// thread made too (an allocation there): every arena's memory comes from one thread's heap,
    /// side by side, as when a program makes its streams up front.
    MadeUpFront,
    /// Every thread on the null stream (one arena).
    Null,
}

/// Aggregate operations per second (millions) of `threads` threads placed as `streams` says:
/// `run` does `iters` operations on the calling thread; the rate is the total over the slowest
/// thread's time.
fn threads_rate(
    threads: usize,
    iters: u64,
    streams: Streams,
    run: impl Fn(Option<&Stream>, u64) + Send + Sync + 'static,
) -> f64 {
    let run = Arc::new(run);
    let start = Arc::new(Barrier::new(threads + 1));
    let made: Vec<Option<Stream>> = (0..threads)
        .map(|_| {
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
        .map(|made| {
            let (run, start) = (Arc::clone(&run), Arc::clone(&start));
            std::thread::spawn(move || {
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
fn parallel_loop(iters: u64) {
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

/// The median of 5 runs of [`threads_rate`].
fn median_rate(
    threads: usize,
    iters: u64,
    streams: Streams,
    run: impl Fn(Option<&Stream>, u64) + Clone + Send + Sync + 'static,
) -> f64 {
    median(&mut (0..5).map(|_| threads_rate(threads, iters, streams, run.clone())).collect::<Vec<_>>())
}

fn threads(report: &mut Report) {
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
    let (mut single, mut single_loop, mut single_null, mut single_system) = (0.0, 0.0, 0.0, 0.0);
    for n in [1usize, 4, 8] {
        // The loop first and last around gpumem's figure, so a clock that drifts during the run
        // shows in their difference.
        let loop_before = median_rate(n, 2_000_000, Streams::Own, |_, iters| parallel_loop(iters));
        let ours = median_rate(n, 2_000_000, Streams::Own, pooled.clone());
        let ptrs = median_rate(n, 2_000_000, Streams::Own, pointers.clone());
        let null = median_rate(n, 2_000_000, Streams::Null, pooled.clone());
        let own = median_rate(n, 2_000_000, Streams::Own, own_pools);
        let up_front = median_rate(n, 2_000_000, Streams::MadeUpFront, pooled.clone());
        let sys = median_rate(n, 2_000_000, Streams::Own, system);
        let loop_after = median_rate(n, 2_000_000, Streams::Own, |_, iters| parallel_loop(iters));
        let looped = (loop_before + loop_after) / 2.0;
        if n == 1 {
            (single, single_loop, single_null, single_system) = (ours, looped, null, sys);
        }
        let anchor = threads_rate(n, if on_host() { 1_000 } else { 100_000 }, Streams::Own, |s, iters| {
            let h = s.expect("own stream").handle();
            for _ in 0..iters {
                // SAFETY: `s` is alive for the loop, so its handle is.
                let Ok(ptr) = (unsafe { B::malloc_async(dev(), 4096, h) }) else { return };
                // SAFETY: just allocated on `h`, unused.
                unsafe { B::free_async(dev(), ptr, h).unwrap() };
            }
        });
        let label = format!("{n} thread(s)");
        report.add(
            "threads",
            label.clone(),
            ours,
            "cuMemAllocAsync, same threads",
            Some(anchor),
            "M/s",
            false,
        );
        report.add(
            "threads",
            label.clone(),
            ours,
            "PyTorch caching allocator (C++)",
            report.external(&format!("torch_cpp_threads_{n}")),
            "M/s",
            false,
        );
        report.add(
            "threads",
            label.clone(),
            ours,
            "CuPy MemoryPool (Python)",
            report.external(&format!("cupy_threads_{n}")),
            "M/s",
            false,
        );
        report.add(
            "threads",
            format!("{label}, MemoryPointer"),
            ptrs,
            "pool's own path, same threads",
            Some(ours),
            "M/s",
            false,
        );
        report.add(
            "threads",
            format!("{label}, all on the null stream (one arena)"),
            null,
            "own streams",
            Some(ours),
            "M/s",
            false,
        );
        report.add(
            "threads",
            format!("{label}, each its own pool"),
            own,
            "one pool",
            Some(ours),
            "M/s",
            false,
        );
        report.add(
            "threads",
            format!("{label}, streams and arenas made up front on one thread"),
            up_front,
            "each thread's own",
            Some(ours),
            "M/s",
            false,
        );
        report.add(
            "threads",
            format!("{label}, the system allocator (4 KiB alloc + dealloc)"),
            sys,
            "-",
            None,
            "M/s",
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
            report.add(
                "threads",
                format!("{n} threads over 1 thread (scaling)"),
                ours / single,
                "target",
                Some(target),
                "x",
                false,
            );
            report.add(
                "threads",
                format!("{n} threads over 1 thread (scaling)"),
                ours / single,
                "the loop sharing nothing, its scaling",
                Some(looped / single_loop),
                "x",
                false,
            );
            report.add(
                "threads",
                format!("{n} threads over 1 thread (scaling)"),
                ours / single,
                "the system allocator's scaling",
                Some(sys / single_system),
                "x",
                false,
            );
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

/// Milliseconds of device time of one run of `f`, between two events on `stream`.
fn device_ms_once(stream: &Stream, f: &mut impl FnMut()) -> f64 {
    let start = stream.record(None).unwrap();
    f();
    let end = stream.record(None).unwrap();
    end.synchronize().unwrap();
    f64::from(gpumem::get_elapsed_time(&start, &end).unwrap())
}

/// Milliseconds of device time of `f`: the median of 5 runs after a warm-up.
fn device_ms(stream: &Stream, mut f: impl FnMut()) -> f64 {
    f();
    stream.synchronize().unwrap();
    median(&mut (0..5).map(|_| device_ms_once(stream, &mut f)).collect::<Vec<_>>())
}

/// Milliseconds of device time of `ours` and `theirs`, run alternately so that drifting clocks
/// and caches treat both alike: the median of 7 runs each.
fn device_ms_pair(stream: &Stream, mut ours: impl FnMut(), mut theirs: impl FnMut()) -> (f64, f64) {
    ours();
    theirs();
    stream.synchronize().unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        a.push(device_ms_once(stream, &mut ours));
        b.push(device_ms_once(stream, &mut theirs));
    }
    (median(&mut a), median(&mut b))
}

fn transfers(report: &mut Report) {
    const N: usize = 1 << 30;
    eprintln!("1 GiB transfers (GB/s, CUDA events, median of 7, alternating with the raw call)");
    let gb = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    let s = Stream::non_blocking().unwrap();
    let a = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    let b = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    a.memset(1, N).unwrap();
    let pinned = PinnedMemoryPointer::alloc(N).unwrap();
    pinned.write(&vec![3u8; N]).unwrap();
    let (h, d, host) = (s.handle(), dev(), pinned.ptr() as usize);

    // Every raw call below uses ranges of live allocations of N bytes (`a`, `b`, `pinned`) that
    // outlive the synchronised timing.
    let (ours, raw) = device_ms_pair(
        &s,
        || a.copy_from_host_async(&pinned, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, a.ptr(), host, N, h).unwrap() },
    );
    report.add(
        "transfers",
        "host to device, pinned",
        gb(N, ours),
        "cuMemcpyAsync",
        Some(gb(N, raw)),
        "GB/s",
        false,
    );
    let (ours, raw) = device_ms_pair(
        &s,
        || a.copy_to_host_async(&pinned, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, host, a.ptr(), N, h).unwrap() },
    );
    report.add(
        "transfers",
        "device to host, pinned",
        gb(N, ours),
        "cuMemcpyAsync",
        Some(gb(N, raw)),
        "GB/s",
        false,
    );
    // Pageable copies: `pageable`, timed on the host clock (they are synchronous).
    let (ours, raw) = device_ms_pair(
        &s,
        || b.copy_from_device_async(&a, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, b.ptr(), a.ptr(), N, h).unwrap() },
    );
    report.add(
        "transfers",
        "device to device (read + write)",
        gb(2 * N, ours),
        "cuMemcpyAsync",
        Some(gb(2 * N, raw)),
        "GB/s",
        false,
    );
    let (ours, raw) = device_ms_pair(
        &s,
        || b.memset_async(7, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memset_async(d, b.ptr(), 7, N, h).unwrap() },
    );
    report.add("transfers", "memset", gb(N, ours), "cuMemsetD8Async", Some(gb(N, raw)), "GB/s", false);
}

/// Seconds of one synchronous call of `f`, on the host clock.
fn wall_once(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Seconds of `ours` and `theirs`, run alternately (drifting clocks and caches treat both
/// alike) after one warm-up each: the median of `runs` each.
fn wall_pair(runs: usize, mut ours: impl FnMut(), mut theirs: impl FnMut()) -> (f64, f64) {
    ours();
    theirs();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(wall_once(&mut ours));
        b.push(wall_once(&mut theirs));
    }
    (median(&mut a), median(&mut b))
}

/// Synchronous copies of pageable memory: gpumem's (staged through pinned buffers from the
/// threshold up) against the runtime's own `cuMemcpy` of the same bytes, on the host clock, as
/// the caller sees them (both return when the copy is done).
fn pageable(report: &mut Report) {
    const N: usize = 1 << 30;
    eprintln!("pageable copies (GB/s, host clock, median, alternating with the raw cuMemcpy)");
    let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let runs = |size: usize| if size >= 64 << 20 { 7 } else { 51 };
    let d = dev();
    let a = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    a.memset(1, N).unwrap();
    let mut host = vec![5u8; N];
    let host_ptr = host.as_mut_ptr() as usize;
    let default = gpumem::PageableStaging::current::<B>().unwrap();
    eprintln!(
        "  staging: threshold {:?}, chunk {} B, {} lanes",
        default.threshold(),
        default.chunk(),
        default.lanes()
    );
    // Every raw call and slice below is of at most N bytes of `a` and `host`, live allocations
    // of N bytes that outlive the timing; nothing else touches `host` meanwhile.
    // SAFETY: as above; the slice is only read, and no mutable one lives meanwhile.
    let src = |n: usize| unsafe { std::slice::from_raw_parts(host_ptr as *const u8, n) };
    // SAFETY: as above; each slice is the only view of `host` while it lives.
    let dst = |n: usize| unsafe { std::slice::from_raw_parts_mut(host_ptr as *mut u8, n) };
    let h2d = |n: usize| a.copy_from_host(src(n), n).unwrap();
    let d2h = |n: usize| a.copy_to_host(dst(n), n).unwrap();
    // SAFETY: live ranges of N bytes, as above.
    let raw_h2d = |n: usize| unsafe { B::memcpy(d, a.ptr(), host_ptr, n).unwrap() };
    // SAFETY: live ranges of N bytes, as above.
    let raw_d2h = |n: usize| unsafe { B::memcpy(d, host_ptr, a.ptr(), n).unwrap() };

    // The rows users get: the default setting (staged from its threshold up).
    for (label, n) in [("1 MiB", 1usize << 20), ("64 MiB", 64 << 20), ("1 GiB", N)] {
        let (ours, raw) = wall_pair(runs(n), || h2d(n), || raw_h2d(n));
        let what = format!("host to device, pageable, {label}");
        report.add("pageable", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(runs(n), || d2h(n), || raw_d2h(n));
        let what = format!("device to host, pageable, {label}");
        report.add("pageable", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
    }

    // Where staging starts to win: every copy staged, against the raw copy, by size (the
    // default threshold should sit where the ratio passes 1).
    let forced = gpumem::PageableStaging::from_size(0);
    for (label, n) in [
        ("64 KiB", 64usize << 10),
        ("256 KiB", 256 << 10),
        ("1 MiB", 1 << 20),
        ("2 MiB", 2 << 20),
        ("4 MiB", 4 << 20),
        ("8 MiB", 8 << 20),
        ("16 MiB", 16 << 20),
    ] {
        let _scope = forced.enter();
        let (ours, raw) = wall_pair(runs(n), || h2d(n), || raw_h2d(n));
        let what = format!("host to device, always staged, {label}");
        report.add("staging", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(runs(n), || d2h(n), || raw_d2h(n));
        let what = format!("device to host, always staged, {label}");
        report.add("staging", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
    }

    // What the lanes (threads copying into staging buffers) bring at 1 GiB.
    for lanes in [1usize, 2, 4, 8] {
        let _scope = forced.with_lanes(lanes).unwrap().enter();
        let (ours, raw) = wall_pair(5, || h2d(N), || raw_h2d(N));
        let what = format!("host to device, 1 GiB, {lanes} lanes");
        report.add("staging", what, gb(N, ours), "cuMemcpy", Some(gb(N, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(5, || d2h(N), || raw_d2h(N));
        let what = format!("device to host, 1 GiB, {lanes} lanes");
        report.add("staging", what, gb(N, ours), "cuMemcpy", Some(gb(N, raw)), "GB/s", false);
    }
    // The staged path's bytes, checked once (a benchmark of wrong copies is worthless).
    let pattern: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    {
        let _scope = forced.enter();
        a.copy_from_host(&pattern, N).unwrap();
        let back = dst(N);
        back.fill(0);
        a.copy_to_host(back, N).unwrap();
        assert!(back == &pattern[..], "the staged copies changed the bytes");
    }
    drop(host);
}

fn hook_costs(report: &mut Report) {
    eprintln!("hooks (the hit with and without DebugPrintHook on CPU {})", bench_cpu());
    let pool = SingleDeviceMemoryPool::new(dev()).unwrap();
    drop(pool.malloc_pooled(512).unwrap());
    let hit = || drop(black_box(pool.malloc_pooled(black_box(512)).unwrap()));
    // The hooked and unhooked hits on the single-thread rows' CPU, round by round (the hook
    // installed for every other round), so that neither a move to another CPU nor a drifting
    // clock falls on one of them alone: the median of 11 rounds of 200,000 pairs each.
    let (bare, with_hook) = on_bench_cpu(|| {
        let (mut bare, mut hooked) = (Vec::new(), Vec::new());
        for _ in 0..11 {
            bare.push(ns_per_iter(1, 200_000, hit));
            let hook =
                hooks::install(DebugPrintHook::with_flush(BufWriter::new(std::io::sink()), false)).unwrap();
            hooked.push(ns_per_iter(1, 200_000, hit));
            drop(hook);
        }
        (median(&mut bare), median(&mut hooked))
    });
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
        with_hook / bare,
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
fn arena_lock(report: &mut Report) {
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
        shared.push(median_rate(8, 100_000, Streams::Null, move |_, iters| {
            for _ in 0..iters {
                drop(black_box(p.malloc_pooled(black_box(4096)).unwrap()));
            }
        }));
    }
    report.add("arena lock", format!("cache hit, {lock} lock"), median(&mut hit), "", None, "ns", true);
    report.add(
        "arena lock",
        format!("8 threads on the null stream (one arena), {lock} lock"),
        median(&mut shared),
        "",
        None,
        "M pairs/s",
        false,
    );
}

// HIP has no graphs: its graph type is uninhabited, so the code after capture is unreachable
// there (and the function returns early at run time anyway).
#[cfg_attr(all(feature = "hip", not(feature = "cuda")), allow(unreachable_code, unused_variables))]
fn graphs(report: &mut Report) {
    const OPS: usize = 1000;
    const SIZE: usize = 64 << 10;
    eprintln!("graph of {OPS} memsets of {SIZE} bytes (ms per launch)");
    let s = Stream::non_blocking().unwrap();
    let buf = gpumem::alloc(OPS * SIZE).unwrap();
    let eager = device_ms(&s, || {
        for i in 0..OPS {
            (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s)).unwrap();
        }
    });
    // What keeping memory alive for queued work costs an eager operation: the same memsets
    // through the typed API and as raw driver calls, in one run.
    let (d, h) = (dev(), s.handle());
    let (typed, raw) = device_ms_pair(
        &s,
        || {
            for i in 0..OPS {
                (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s)).unwrap();
            }
        },
        || {
            for i in 0..OPS {
                // SAFETY: the range lies in `buf`, alive until the work is done (`device_ms_pair`
                // synchronises the stream).
                unsafe { B::memset_async(d, buf.ptr() + i * SIZE, i as u8, SIZE, h).unwrap() };
            }
        },
    );
    report.add(
        "transfers",
        format!("{OPS} eager memset_async of {SIZE} B, per operation"),
        typed * 1e3 / OPS as f64,
        "cuMemsetD8Async",
        Some(raw * 1e3 / OPS as f64),
        "us",
        true,
    );
    let typed_graph = (|| {
        s.begin_capture(None)?;
        for i in 0..OPS {
            (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s))?;
        }
        s.end_capture()
    })();
    let Ok(typed_graph) = typed_graph else {
        eprintln!("  (no capture on this backend: skipped)");
        return;
    };
    // SAFETY: `s` outlives every use of its handle `h` below.
    unsafe { B::begin_capture(d, h, gpumem::CaptureMode::Relaxed).unwrap() };
    for i in 0..OPS {
        // SAFETY: the range lies in `buf`, which outlives the graph's launches below.
        unsafe { B::memset_async(d, buf.ptr() + i * SIZE, i as u8, SIZE, h).unwrap() };
    }
    // SAFETY: as above.
    let raw_graph = unsafe { B::end_capture(d, h).unwrap() };
    let (replay, raw) = device_ms_pair(
        &s,
        || typed_graph.launch(Some(&s)).unwrap(),
        // SAFETY: as above.
        || unsafe { B::graph_launch(d, &raw_graph, h).unwrap() },
    );
    B::graph_destroy(d, raw_graph).unwrap();
    report.add(
        "graphs",
        "captured gpumem memsets, replay",
        replay,
        "the same, eager",
        Some(eager),
        "ms",
        true,
    );
    report.add(
        "graphs",
        "captured gpumem memsets, replay",
        replay,
        "raw driver calls captured by hand",
        Some(raw),
        "ms",
        true,
    );
}

/// A raw allocator that counts the calls it forwards to `inner`, the bytes it holds and their
/// peak. With an expandable `inner`, each growth counts as a raw allocation and each shrink as a
/// raw free (as PyTorch counts its expandable segments' maps and unmaps).
struct Counting<A: RawAllocator> {
    inner: A,
    held: Arc<AtomicUsize>,
    peak: AtomicUsize,
    allocs: AtomicUsize,
    frees: Arc<AtomicUsize>,
}

impl<A: RawAllocator> Counting<A> {
    fn new(inner: A) -> Self {
        Counting {
            inner,
            held: Arc::new(AtomicUsize::new(0)),
            peak: AtomicUsize::new(0),
            allocs: AtomicUsize::new(0),
            frees: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn add(&self, bytes: usize) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.allocs.fetch_add(1, Ordering::Relaxed);
    }
}

struct Counted<K: RawBlock> {
    block: K,
    held: Arc<AtomicUsize>,
    frees: Arc<AtomicUsize>,
}

impl<K: RawBlock> Drop for Counted<K> {
    fn drop(&mut self) {
        self.held.fetch_sub(self.block.size(), Ordering::Relaxed);
        self.frees.fetch_add(1, Ordering::Relaxed);
    }
}

impl<K: RawBlock> RawBlock for Counted<K> {
    fn address(&self) -> usize {
        self.block.address()
    }
    fn size(&self) -> usize {
        self.block.size()
    }
    fn device(&self) -> DeviceId {
        self.block.device()
    }
}

impl<A: RawAllocator> RawAllocator for Counting<A> {
    type Block = Counted<A::Block>;

    fn allocate(&self, device: DeviceId, size: usize) -> gpumem::Result<Self::Block> {
        let block = self.inner.allocate(device, size)?;
        self.add(block.size());
        Ok(Counted { block, held: Arc::clone(&self.held), frees: Arc::clone(&self.frees) })
    }
    fn expandable(&self) -> bool {
        self.inner.expandable()
    }
    fn granule(&self) -> usize {
        self.inner.granule()
    }
    fn grow(&self, block: &mut Self::Block, extra: usize) -> gpumem::Result<bool> {
        let grown = self.inner.grow(&mut block.block, extra)?;
        if grown {
            self.add(extra);
        }
        Ok(grown)
    }
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> gpumem::Result<usize> {
        let shrunk = self.inner.shrink(&mut block.block, bytes)?;
        if shrunk > 0 {
            self.held.fetch_sub(shrunk, Ordering::Relaxed);
            self.frees.fetch_add(1, Ordering::Relaxed);
        }
        Ok(shrunk)
    }
}

/// What one replay of a trace through a fresh pool measured.
#[derive(Clone)]
struct Replayed {
    ratio: f64,
    allocs: usize,
    frees: usize,
    /// Raw allocations and frees from each of the replay's marks to the next (the last: to the
    /// end): for a training trace, its second step, then its third and later steps.
    in_steps: Vec<usize>,
    ms: f64,
    /// Allocations served by another stream's free chunk.
    across: u64,
}

/// How a replay's pool is set up: its policy, its raw allocator, and whether it lends memory
/// across the trace's streams.
#[derive(Clone, Copy)]
struct Setup {
    policy: GrowthPolicy,
    raw: Raw,
    share: bool,
}

/// The raw allocator of a replay.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Raw {
    /// `cuMemAlloc` per block.
    Plain,
    /// Expandable segments on the virtual-memory API.
    Expandable,
}

/// Replays a trace through a fresh pool (the pool's own API, each trace stream its own arena)
/// with `policy`, timed from the first step to a device synchronisation after the last (the pool
/// is made before and dropped after the clock). Raw frees are those made during the replay.
fn replay_once(steps: &[trace::Step], marks: &[usize], setup: Setup) -> Replayed {
    fn run<A: RawAllocator>(
        steps: &[trace::Step],
        marks: &[usize],
        policy: GrowthPolicy,
        counting: Arc<Counting<A>>,
        share: bool,
    ) -> Replayed {
        let expandable = counting.expandable();
        let pool = gpumem::core::pool::Pool::new(dev(), Arc::clone(&counting));
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
        let calls = || counting.allocs.load(Ordering::Relaxed) + counting.frees.load(Ordering::Relaxed);
        let mut per_step = trace::CountsBetweenMarks::new(marks);
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
        let in_steps = per_step.finish(calls());
        let (allocs, frees) =
            (counting.allocs.load(Ordering::Relaxed), counting.frees.load(Ordering::Relaxed));
        let ratio = counting.peak.load(Ordering::Relaxed) as f64 / trace::peak_in_use(steps) as f64;
        let across = pool.stats().all.lent_across_streams;
        drop(pool);
        drop(streams);
        Replayed { ratio, allocs, frees, in_steps, ms, across }
    }
    let Setup { policy, raw, share } = setup;
    match raw {
        Raw::Plain => run(steps, marks, policy, Arc::new(Counting::new(DeviceAllocator::new())), share),
        Raw::Expandable => {
            // A quarter of the device per block at most: the host backend's reserved ranges are
            // host address space, which the operating system may refuse in one piece.
            let total = gpumem::Device::current().properties().unwrap().total_memory;
            let inner =
                ExpandableAllocator::<B>::new(dev(), expandable::DEFAULT_RESERVE.min(total / 4)).unwrap();
            run(steps, marks, policy, Arc::new(Counting::new(inner)), share)
        }
    }
}

/// One warm-up replay, then `REPLAYS` timed ones: the median time; the counts and the ratio of
/// the first timed one (every replay starts from an empty pool, so they are the same each time).
fn replay(steps: &[trace::Step], marks: &[usize], setup: Setup) -> Replayed {
    const REPLAYS: usize = 5;
    replay_once(steps, marks, setup);
    let runs: Vec<Replayed> = (0..REPLAYS).map(|_| replay_once(steps, marks, setup)).collect();
    let ms = median(&mut runs.iter().map(|r| r.ms).collect::<Vec<_>>());
    Replayed { ms, ..runs[0].clone() }
}

/// The traces the fragmentation rows replay: the random one, and those `bench/run-gpu.sh`
/// recorded (`training.trace`: GPT-2, `bert.trace`: BERT fine-tuning) when present.
/// Each with the indices where its second and third training steps begin, if it marks them.
fn traces(dir: Option<&str>) -> Vec<(&'static str, Vec<trace::Step>, Vec<usize>)> {
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
fn later_steps(text: &str) -> Vec<usize> {
    trace::step_marks(text).into_iter().skip(1).take(2).collect()
}

/// gpumem's configurations: (label, policy, raw allocator, memory shared across streams).
const POLICIES: [(&str, GrowthPolicy, Raw, bool); 6] = [
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
];

/// The anchors' rows: (label, key prefix in anchors.txt).
const FRAG_ANCHORS: [(&str, &str); 3] = [
    ("PyTorch caching allocator, default", "torch_default"),
    ("PyTorch, expandable_segments:True", "torch_expandable"),
    ("CuPy MemoryPool", "cupy"),
];

/// The fragmentation table: every allocator on every trace, with what its ratio cost. Also adds
/// the Segments policy's rows against the targets and PyTorch's default to the report.
fn fragmentation(report: &mut Report, dir: Option<&str>) -> String {
    eprintln!("fragmentation: peak held / peak in use, raw calls, replay time (median of 5 after a warm-up)");
    let mut table = String::new();
    writeln!(
        table,
        "| trace | allocator | held / in use | raw allocations | raw frees | raw calls in step 2 | from step 3 on | replay |"
    )
    .unwrap();
    writeln!(table, "| --- | --- | --- | --- | --- | --- | --- | --- |").unwrap();
    for (name, steps, marks) in traces(dir) {
        let label = format!("{} ({} steps)", name.replace('_', " "), steps.len());
        let mut ours = Vec::new();
        for (what, policy, raw, share) in POLICIES {
            if raw == Raw::Expandable && !<B as gpumem::core::Api>::CAPS.virtual_memory {
                continue;
            }
            let r = replay(&steps, &marks, Setup { policy, raw, share });
            let step = |k: usize| r.in_steps.get(k).map_or("-".into(), usize::to_string);
            let (second, later) = (step(0), step(1));
            eprintln!(
                "  {label:<22} {what:<36} {:.3}  {:>5} allocs {:>5} frees {second:>5} in step 2 {later:>5} after {:>9.2} ms  {} lent across streams",
                r.ratio, r.allocs, r.frees, r.ms, r.across
            );
            writeln!(
                table,
                "| {label} | {what} | {:.3} | {} | {} | {second} | {later} | {:.1} ms |",
                r.ratio, r.allocs, r.frees, r.ms
            )
            .unwrap();
            ours.push((policy, raw, share, r));
        }
        for (what, key) in FRAG_ANCHORS {
            let get = |field: &str| report.external(&format!("{key}_frag_{name}_{field}"));
            let Some(ratio) = get("ratio") else {
                writeln!(table, "| {label} | {what} | - | - | - | - | - | - |").unwrap();
                continue;
            };
            let count = |field: &str| get(field).map_or("-".into(), |v| format!("{v:.0}"));
            let ms = get("ms").map_or("-".into(), |v| format!("{v:.1} ms"));
            writeln!(
                table,
                "| {label} | {what} | {ratio:.3} | {} | {} | {} | {} | {ms} |",
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
fn middle(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// The random trace drawn from `seed`, on one stream: what the seed table replays.
fn seed_steps(seed: u64) -> Vec<trace::Step> {
    trace::on_one_stream(&trace::random_seeded(seed))
}

/// The host replay of `steps` (no device: ratio and raw calls depend only on the pool's rules and
/// the trace) with each of `policies`, a line each, after `prefix`.
fn print_host_replays(
    prefix: &str,
    steps: &[trace::Step],
    marks: &[usize],
    policies: &[(&str, GrowthPolicy, Raw, bool)],
) {
    for &(what, policy, raw, share) in policies {
        let options = trace::ReplayOptions {
            expandable: raw == Raw::Expandable,
            share_across_streams: share,
            marks: marks.to_vec(),
        };
        let r = trace::replay_with(steps, policy, options).expect("replay");
        let step = |k: usize| r.raw_calls_in_steps.get(k).map_or("-".into(), usize::to_string);
        let (second, later) = (step(0), step(1));
        println!(
            "{prefix}{what:<52} held / in use {:.4}  raw allocations {:>5}  raw frees {:>5}  in step 2 {second:>4}  from step 3 {later:>4}  lent across streams {:>5}",
            r.ratio(),
            r.raw_allocs,
            r.raw_frees,
            r.lent_across_streams
        );
    }
}

/// The name of the trace of seed `seed`: its key in anchors.txt and its file, with `.trace`.
fn seed_trace(seed: u64) -> String {
    format!("random_seed{seed}")
}

/// The random trace on one stream drawn from each of [`trace::OTHER_SEEDS`]: what each
/// allocator holds over the peak in use and its raw allocations, seed by seed, with the median
/// of each column (the figure on the standard seed is read beside these). Adds gpumem's median
/// against PyTorch's to the report.
fn seed_table(report: &mut Report) -> String {
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
            if raw == Raw::Expandable && !<B as gpumem::core::Api>::CAPS.virtual_memory {
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

fn read_anchors(dir: Option<&str>) -> Anchors {
    let Some(text) = dir.and_then(|d| std::fs::read_to_string(format!("{d}/anchors.txt")).ok()) else {
        return Anchors::new();
    };
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--write-trace") {
        let path = args.get(i + 1).expect("--write-trace PATH");
        std::fs::write(path, trace::render(&trace::standard_random())).expect("write the trace");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--write-seeds") {
        // The other seeds' traces, already on one stream, for the anchors to replay.
        let dir = args.get(i + 1).expect("--write-seeds DIR");
        for seed in trace::OTHER_SEEDS {
            let path = format!("{dir}/{}.trace", seed_trace(seed));
            std::fs::write(&path, trace::render(&seed_steps(seed))).expect("write the trace");
        }
        return;
    }
    if args.iter().any(|a| a == "--replay-seeds") {
        // gpumem's side of the seed table without a device.
        // One stream: memory shared across streams changes nothing.
        let policies: Vec<_> = POLICIES.into_iter().filter(|p| !p.3).collect();
        for seed in trace::OTHER_SEEDS {
            print_host_replays(&format!("seed {seed}  "), &seed_steps(seed), &[], &policies);
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--replay-host") {
        // The fragmentation figures on the pool alone (no device), for any trace file: ratio and
        // raw calls depend only on the pool's rules and the trace.
        let path = args.get(i + 1).expect("--replay-host PATH");
        let text = std::fs::read_to_string(path).expect("read the trace");
        let steps = trace::parse(&text).expect("a trace");
        // `--one-stream`: every step on one stream, the allocator's own fragmentation.
        let steps =
            if args.iter().any(|a| a == "--one-stream") { trace::on_one_stream(&steps) } else { steps };
        print_host_replays("", &steps, &later_steps(&text), &POLICIES);
        return;
    }
    let dir = std::env::var("GPUMEM_BENCH_DIR").ok();
    let props = gpumem::Device::current().properties().expect("a device");
    eprintln!("gpumem {} backend, device 0: {}", <B as gpumem::core::Api>::NAME, props.name);
    let mut report = Report { rows: Vec::new(), anchors: read_anchors(dir.as_deref()) };
    let only = std::env::var("GPUMEM_BENCH_ONLY").ok();
    let run = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == name));
    let started = Instant::now();
    if run("allocation") {
        on_bench_cpu(|| allocation(&mut report));
    }
    if run("threads") {
        threads(&mut report);
    }
    if run("hooks") {
        hook_costs(&mut report);
    }
    if run("arena_lock") {
        arena_lock(&mut report);
    }
    if run("transfers") {
        transfers(&mut report);
    }
    if run("pageable") {
        pageable(&mut report);
    }
    if run("graphs") {
        graphs(&mut report);
    }
    let frag = if run("fragmentation") { fragmentation(&mut report, dir.as_deref()) } else { String::new() };
    let mut table = report.markdown();
    if !frag.is_empty() {
        table.push('\n');
        table.push_str(&frag);
    }
    println!("\n{table}");
    if let Some(d) = &dir {
        let mut f = std::fs::File::create(format!("{d}/table.md")).expect("write the table");
        f.write_all(table.as_bytes()).expect("write the table");
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
}
