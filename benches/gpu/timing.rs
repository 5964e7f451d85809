//! How the rows are timed: medians of batches, device time between events, the host clock, and the
//! CPU the single-thread rows run on.

use std::hint::black_box;
use std::time::Instant;

use gpumem::{DefaultBackend as B, DeviceId, SingleDeviceMemoryPool, Stream};

/// Nanoseconds per iteration of `f`, the median of `rounds` timed batches of `iters`.
pub(crate) fn ns_per_iter(rounds: usize, iters: u64, mut f: impl FnMut()) -> f64 {
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

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The host backend runs this program too, to check it; its anchors are slow and meaningless, so
/// they run fewer iterations.
pub(crate) fn on_host() -> bool {
    <B as gpumem::core::Api>::NAME == "host"
}

pub(crate) fn dev() -> DeviceId {
    gpumem::Device::current().id()
}

/// Heap placements the cache hit is measured in: each pool is made, and its arena with it, after
/// a buffer 256 bytes longer than the one before (the first after none). The same hit on one CPU
/// in one binary takes up to half as long again in some placements of its arena's data as in
/// others (on the host backend, 25 ns in most and 34 to 42 ns in a few, depending only on what
/// was allocated before the pool), so a figure from one pool is a draw: the rows give the median
/// over the placements, and the log each placement's figure.
pub(crate) const PLACEMENTS: usize = 16;

/// [`PLACEMENTS`] pools, each made after a buffer of its own, 256 bytes longer than the one
/// before, and each pool's arena and blocks made right after it (an allocation of each of
/// `sizes` on the calling thread's stream). The buffers come back with the pools: keep them
/// until the pools are dropped, so that no later allocation takes their place.
pub(crate) fn placed_pools(sizes: &[usize]) -> (Vec<SingleDeviceMemoryPool>, Vec<Vec<u8>>) {
    let mut pads = Vec::with_capacity(PLACEMENTS);
    let pools = (0..PLACEMENTS)
        .map(|k| {
            pads.push(black_box(vec![0u8; 256 * k]));
            let pool = SingleDeviceMemoryPool::new(dev()).unwrap();
            for &size in sizes {
                drop(pool.malloc_pooled(size).unwrap());
            }
            pool
        })
        .collect();
    (pools, pads)
}

pub(crate) const SIZES: [(&str, usize); 3] = [("512 B", 512), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)];

/// The CPU the single-thread allocation rows run on, and `bench/anchors.py` runs PyTorch's and
/// CuPy's single-thread anchors on: `GPUMEM_BENCH_CPU`, 3 unless set. The GPU machine's CPUs run
/// the same code at different speeds (the same cache hit took 38 to 55 ns on four of them in one
/// call), so a ratio between two processes left on different CPUs would measure the CPUs.
pub(crate) fn bench_cpu() -> usize {
    match std::env::var("GPUMEM_BENCH_CPU") {
        Err(_) => 3,
        Ok(v) => {
            v.trim().parse().unwrap_or_else(|_| panic!("GPUMEM_BENCH_CPU must be a CPU number, not {v:?}"))
        }
    }
}

/// Runs `f` on a thread pinned to [`bench_cpu`] (on the calling thread, unpinned, where that
/// CPU does not exist, as on a small host machine).
pub(crate) fn on_bench_cpu<T: Send>(f: impl FnOnce() -> T + Send) -> T {
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

/// Milliseconds of device time of one run of `f`, between two events on `stream`.
pub(crate) fn device_ms_once(stream: &Stream, f: &mut impl FnMut()) -> f64 {
    let start = stream.record(None).unwrap();
    f();
    let end = stream.record(None).unwrap();
    end.synchronize().unwrap();
    f64::from(gpumem::get_elapsed_time(&start, &end).unwrap())
}

/// Milliseconds of device time of `f`: the median of 5 runs after a warm-up.
pub(crate) fn device_ms(stream: &Stream, mut f: impl FnMut()) -> f64 {
    f();
    stream.synchronize().unwrap();
    median(&mut (0..5).map(|_| device_ms_once(stream, &mut f)).collect::<Vec<_>>())
}

/// Milliseconds of device time of `ours` and `theirs`, run alternately so that drifting clocks
/// and caches treat both alike: the median of 7 runs each.
pub(crate) fn device_ms_pair(
    stream: &Stream,
    mut ours: impl FnMut(),
    mut theirs: impl FnMut(),
) -> (f64, f64) {
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

/// Seconds of one synchronous call of `f`, on the host clock.
pub(crate) fn wall_once(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Seconds of `ours` and `theirs`, run alternately (drifting clocks and caches treat both
/// alike) after one warm-up each: the median of `runs` each.
pub(crate) fn wall_pair(runs: usize, mut ours: impl FnMut(), mut theirs: impl FnMut()) -> (f64, f64) {
    ours();
    theirs();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(wall_once(&mut ours));
        b.push(wall_once(&mut theirs));
    }
    (median(&mut a), median(&mut b))
}
