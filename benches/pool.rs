//! The pool's hot path on the host backend: a cache hit (allocate + free of the same size), the
//! cost of the hook check, the aggregate rate of threads each on its own stream, the arena
//! lock against `parking_lot`'s raw mutex, and an iteration of a loop served from the plan
//! learned from it against the same iteration's cache hits.
//!
//! `cargo bench -p gpumem-benches --bench pool`

#![allow(missing_docs)] // `criterion_group!` generates undocumented items

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpumem_core::host::Host;
use gpumem_core::{
    alloc, get_allocator, hooks, DeviceBuffer, MemoryHook, MemoryPointer, PlanState, SingleDeviceMemoryPool,
    Stream,
};

fn cache_hit(c: &mut Criterion) {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let mut g = c.benchmark_group("cache_hit");
    for (name, size) in [("512B", 512), ("1MiB", 1 << 20), ("64MiB", 64 << 20)] {
        drop(pool.malloc_pooled(size).unwrap());
        g.bench_function(BenchmarkId::new("malloc_pooled+free", name), |b| {
            b.iter(|| drop(black_box(pool.malloc_pooled(black_box(size)).unwrap())))
        });
    }
    g.bench_function("malloc(MemoryPointer)+free/512B", |b| {
        b.iter(|| drop(black_box(pool.malloc(black_box(512)).unwrap())))
    });
    // The pointer over a reference-counted chunk, as every pointer was before chunks were held
    // inline: the same pool call plus the `Arc`.
    g.bench_function("MemoryPointer over an Arc (from_memory)+free/512B", |b| {
        b.iter(|| drop(black_box(MemoryPointer::from_memory(pool.malloc_pooled(black_box(512)).unwrap()))))
    });
    g.finish();

    // What `alloc` and `DeviceBuffer` go through: the current allocator (the default pool).
    let mut g = c.benchmark_group("current_allocator");
    drop(alloc::<Host>(512).unwrap());
    g.bench_function("alloc+free/512B", |b| {
        b.iter(|| drop(black_box(alloc::<Host>(black_box(512)).unwrap())))
    });
    g.bench_function("get_allocator().malloc+free/512B (the lookup alloc made before)", |b| {
        b.iter(|| drop(black_box(get_allocator::<Host>().malloc(black_box(512)).unwrap())))
    });
    g.bench_function("DeviceBuffer<f32> from alloc+free/128 elements", |b| {
        b.iter(|| {
            let p = alloc::<Host>(black_box(512)).unwrap();
            drop(black_box(DeviceBuffer::<f32, Host>::from_pointer(p, 128).unwrap()))
        })
    });
    g.finish();
}

struct Quiet;
impl MemoryHook for Quiet {
    fn name(&self) -> &str {
        "quiet"
    }
}

fn hook_check(c: &mut Criterion) {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    drop(pool.malloc_pooled(512).unwrap());
    let mut g = c.benchmark_group("hook_check");
    g.bench_function("check alone, no hook anywhere", |b| b.iter(|| black_box(hooks::active())));
    g.bench_function("cache_hit, no hook anywhere", |b| {
        b.iter(|| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())))
    });
    // A hook on another thread makes every thread take the thread-local half of the check.
    let (installed, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let (i2, r2) = (installed.clone(), release.clone());
    let other = std::thread::spawn(move || {
        let _hook = hooks::install(Quiet).unwrap();
        i2.wait();
        r2.wait();
    });
    installed.wait();
    g.bench_function("cache_hit, hook on another thread", |b| {
        b.iter(|| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())))
    });
    release.wait();
    other.join().unwrap();
    {
        let _hook = hooks::install(Quiet).unwrap();
        g.bench_function("cache_hit, do-nothing hook on this thread", |b| {
            b.iter(|| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())))
        });
    }
    g.finish();
}

/// `threads` threads, each doing `iters` 4 KiB allocate + free pairs, each on its own non-blocking
/// stream (`own_stream`) or all on the null stream (one arena); returns the wall time of the
/// slowest.
fn run_threads(
    pool: &Arc<SingleDeviceMemoryPool<Host>>,
    threads: usize,
    own_stream: bool,
    iters: u64,
) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (pool, start) = (Arc::clone(pool), Arc::clone(&start));
            std::thread::spawn(move || {
                let stream = own_stream.then(|| Stream::<Host>::non_blocking().unwrap());
                let _g = stream.as_ref().map(|s| s.enter().unwrap());
                drop(pool.malloc_pooled(4096).unwrap());
                start.wait();
                let t = Instant::now();
                for _ in 0..iters {
                    drop(black_box(pool.malloc_pooled(black_box(4096)).unwrap()));
                }
                t.elapsed()
            })
        })
        .collect();
    start.wait();
    handles.into_iter().map(|h| h.join().unwrap()).max().unwrap()
}

fn threads(c: &mut Criterion) {
    let pool = Arc::new(SingleDeviceMemoryPool::<Host>::new(0).unwrap());
    let mut g = c.benchmark_group("threads_own_stream_4KiB");
    for n in [1usize, 4, 8] {
        // One element = one allocate + free pair on one thread; the rate is aggregate.
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| run_threads(&pool, n, true, iters))
        });
    }
    g.finish();
}

/// The pool's arena lock, the one this build has (`pool::ARENA_LOCK`: the hand-written lock by
/// default, one compare-and-swap and a release store per pair; parking_lot's raw mutex with the
/// `parking-lot-arena-lock` feature, a compare-and-swap each way): a cache hit on one thread, and
/// four threads sharing the null stream's arena (no stream entered), where waiters spin and yield
/// or park. Run the bench once with the feature and once without to compare the two.
fn arena_lock(c: &mut Criterion) {
    let name = gpumem_core::pool::ARENA_LOCK;
    let mut g = c.benchmark_group("arena_lock");
    let pool = Arc::new(SingleDeviceMemoryPool::<Host>::new(0).unwrap());
    drop(pool.malloc_pooled(512).unwrap());
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("cache_hit_512B", name), |b| {
        b.iter(|| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())))
    });
    g.throughput(Throughput::Elements(4));
    g.bench_function(BenchmarkId::new("4_threads_null_stream_4KiB", name), |b| {
        b.iter_custom(|iters| run_threads(&pool, 4, false, iters))
    });
    g.finish();
}

/// One iteration of a loop (eight allocations of mixed sizes, freed in reverse): from the pool's
/// cache, and served from the plan (with its `step()`), each allocation then going through the
/// planner's lock and the walk to its offset instead of the free index.
fn planned(c: &mut Criterion) {
    const SIZES: [usize; 8] = [512, 4096, 1 << 20, 3 << 20, 512, 8192, 64 << 10, 2 << 20];
    fn iteration(pool: &SingleDeviceMemoryPool<Host>) {
        let live: Vec<_> = SIZES.iter().map(|&s| pool.malloc_pooled(black_box(s)).unwrap()).collect();
        drop(black_box(live));
    }
    let mut g = c.benchmark_group("loop_iteration_8_allocations");
    g.throughput(Throughput::Elements(SIZES.len() as u64));
    let cached = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    iteration(&cached);
    g.bench_function("cache hits", |b| b.iter(|| iteration(&cached)));
    let planned = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    for _ in 0..4 {
        iteration(&planned);
        planned.pool().step().unwrap();
    }
    assert_eq!(planned.pool().plan_stats().state, PlanState::Planned);
    g.bench_function("served from the plan, step() included", |b| {
        b.iter(|| {
            iteration(&planned);
            planned.pool().step().unwrap();
        })
    });
    assert_eq!(planned.pool().plan_stats().departed, 0);
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = cache_hit, hook_check, threads, arena_lock, planned
}
criterion_main!(benches);
