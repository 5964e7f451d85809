//! The process-wide Recorder's cost through a real pool: a cache-hit allocate + free (two lines)
//! into `BufWriter<Sink>`, with no recorder, with the recorder, and with the recorder writing
//! call sites (a stack walk per line; each instruction pointer symbolised once, before the
//! measurement). The bench profile keeps debug info, so call sites resolve as in a profiling
//! build.

#![allow(missing_docs)]

use std::hint::black_box;
use std::io::{self, BufWriter, Sink};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
use gpumem_hooks::Recorder;

fn recorder(sites: bool) -> Recorder<BufWriter<Sink>> {
    let r = Recorder::new(BufWriter::new(io::sink()));
    if sites {
        r.with_call_sites()
    } else {
        r
    }
}

fn through_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("recorder/pool");
    // A cache hit: malloc and free, two lines.
    g.throughput(Throughput::Elements(2));
    let pool = SingleDeviceMemoryPool::<Host>::new(0).expect("host pool");
    drop(pool.malloc_pooled(24).expect("warm"));
    g.bench_function("malloc + free, no recorder", |b| b.iter(|| drop(pool.malloc_pooled(black_box(24)))));
    for (sites, name) in
        [(false, "malloc + free, Recorder"), (true, "malloc + free, Recorder with call sites")]
    {
        let guard = recorder(sites).install();
        // The first line with sites loads the debug info and symbolises the walk's frames; keep
        // it out of the measurement, as a long-running program pays it once.
        for _ in 0..2 {
            drop(pool.malloc_pooled(black_box(24)));
        }
        g.bench_function(name, |b| b.iter(|| drop(pool.malloc_pooled(black_box(24)))));
        assert!(guard.lines() > 0);
        guard.finish().expect("a sink never fails");
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = through_pool }
criterion_main!(benches);
