//! LineProfileHook's cost per event through a real pool (cache-hit allocate + free: one
//! `malloc_preprocess` recorded), at full depth and at `max_depth = 1` (no stack walk).
//! The bench profile keeps debug info, so call sites resolve as in a profiling build.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
use gpumem_hooks::LineProfileHook;

fn through_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("line_profile/pool");
    g.throughput(Throughput::Elements(1));
    let pool = SingleDeviceMemoryPool::<Host>::new(0).expect("host pool");
    drop(pool.malloc_pooled(24).expect("warm"));
    for max_depth in [0, 1] {
        let hook = install(LineProfileHook::new(max_depth)).expect("install");
        // The first event loads the debug info; keep it out of the measurement.
        drop(pool.malloc_pooled(24));
        g.bench_function(format!("malloc + free, max_depth {max_depth}"), |b| {
            b.iter(|| drop(pool.malloc_pooled(black_box(24))));
        });
        let hook = hook.into_inner();
        assert!(hook.used_bytes() > 0);
        if max_depth == 0 {
            assert!(!hook.entries().is_empty(), "the bench's own frames are reported");
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = through_pool }
criterion_main!(benches);
