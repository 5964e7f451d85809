//! The allocation rows: the cache hit against cuMemAllocAsync, cuMemAlloc, PyTorch's and CuPy's.

use std::collections::HashMap;
use std::hint::black_box;

use gpumem::core::{MemoryOps, StreamOps};
use gpumem::{DefaultBackend as B, Stream};

use crate::report::Report;
use crate::timing::{bench_cpu, dev, median, ns_per_iter, on_host, placed_pools, PLACEMENTS, SIZES};

/// gpumem's cache hit at each of [`SIZES`] on the current thread's stream: the pool's own path
/// (`malloc_pooled`) and the pointer path (`malloc`), each the median over [`PLACEMENTS`] pools
/// of the median of its rounds. The pools, sizes and paths are interleaved round by round, so
/// that a drifting clock treats them alike.
fn hits() -> (HashMap<usize, f64>, HashMap<usize, f64>) {
    let sizes = SIZES.map(|(_, size)| size);
    let (pools, pads) = placed_pools(&sizes);
    let mut pooled: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
    let mut pointer: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
    for _ in 0..3 {
        for (k, pool) in pools.iter().enumerate() {
            for (_, size) in SIZES {
                let t =
                    ns_per_iter(1, 100_000, || drop(black_box(pool.malloc_pooled(black_box(size)).unwrap())));
                pooled.entry((k, size)).or_default().push(t);
                let t = ns_per_iter(1, 100_000, || drop(black_box(pool.malloc(black_box(size)).unwrap())));
                pointer.entry((k, size)).or_default().push(t);
            }
        }
    }
    let over_placements = |rounds: &mut HashMap<(usize, usize), Vec<f64>>, what: &str| {
        SIZES
            .iter()
            .map(|&(name, size)| {
                let mut per_pool: Vec<f64> =
                    (0..PLACEMENTS).map(|k| median(rounds.get_mut(&(k, size)).unwrap())).collect();
                let each: Vec<String> = per_pool.iter().map(|t| format!("{t:.1}")).collect();
                let m = median(&mut per_pool);
                eprintln!(
                    "  {what}, {name}: {m:.1} ns, the median of {PLACEMENTS} heap placements (each: {})",
                    each.join(" ")
                );
                (size, m)
            })
            .collect::<HashMap<usize, f64>>()
    };
    let result = (
        over_placements(&mut pooled, "pool cache hit"),
        over_placements(&mut pointer, "MemoryPointer cache hit"),
    );
    drop(pools);
    drop(pads);
    result
}

pub(crate) fn allocation(report: &mut Report) {
    eprintln!("allocate + free, cache hit (ns per pair), on CPU {}", bench_cpu());
    let stream = Stream::non_blocking().unwrap();
    let _g = stream.enter().unwrap();
    let (mut pooled, mut pointer) = hits();
    for (name, size) in SIZES {
        let ours = pooled.remove(&size).unwrap();
        let ptr_path = pointer.remove(&size).unwrap();
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
            // What the anchor's pool cached goes back before the next anchor allocates: on the
            // host backend, frees that lagged behind the loop left blocks of their own there.
            B::async_pool_trim_to(dev(), 0).unwrap();
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
