//! DebugPrintHook throughput: events per second into `BufWriter<Sink>`, calling the callbacks
//! directly with fixed events, and through a real pool (cache-hit allocate + free, two events)
//! with the hook installed, against the same pool with no hook.

#![allow(missing_docs)]

use std::hint::black_box;
use std::io::{self, BufWriter, Sink};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::{AllocEvent, FreeEvent, MallocEvent, MemoryHook, SingleDeviceMemoryPool};
use gpumem_hooks::DebugPrintHook;

const PTR: usize = 150_496_608_256;
const PMEM_ID: u64 = 0x7f39_200c_5278;
const ALLOC: AllocEvent = AllocEvent { device_id: 0, mem_size: 512, mem_ptr: PTR };
const MALLOC: MallocEvent =
    MallocEvent { device_id: 0, size: 24, mem_size: 512, mem_ptr: PTR, pmem_id: PMEM_ID };
const FREE: FreeEvent = FreeEvent { device_id: 0, mem_size: 512, mem_ptr: PTR, pmem_id: PMEM_ID };

fn sink(flush: bool) -> DebugPrintHook<BufWriter<Sink>> {
    DebugPrintHook::with_flush(BufWriter::new(io::sink()), flush)
}

fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("debug_print/direct");
    g.throughput(Throughput::Elements(1));
    let hook = sink(false);
    g.bench_function("alloc line", |b| b.iter(|| hook.alloc_postprocess(black_box(&ALLOC))));
    g.bench_function("malloc line", |b| b.iter(|| hook.malloc_postprocess(black_box(&MALLOC))));
    g.bench_function("free line", |b| b.iter(|| hook.free_postprocess(black_box(&FREE))));
    let flushing = sink(true);
    g.bench_function("malloc line, flush after each", |b| {
        b.iter(|| flushing.malloc_postprocess(black_box(&MALLOC)));
    });
    g.throughput(Throughput::Elements(3));
    g.bench_function("alloc + malloc + free lines", |b| {
        b.iter(|| {
            hook.alloc_postprocess(black_box(&ALLOC))?;
            hook.malloc_postprocess(black_box(&MALLOC))?;
            hook.free_postprocess(black_box(&FREE))
        });
    });
    g.finish();
}

fn through_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("debug_print/pool");
    // A cache hit: malloc and free, two events.
    g.throughput(Throughput::Elements(2));
    let pool = SingleDeviceMemoryPool::<Host>::new(0).expect("host pool");
    drop(pool.malloc_pooled(24).expect("warm"));
    g.bench_function("malloc + free, no hook", |b| b.iter(|| drop(pool.malloc_pooled(black_box(24)))));
    {
        let _hook = install(sink(false)).expect("install");
        g.bench_function("malloc + free, DebugPrintHook", |b| {
            b.iter(|| drop(pool.malloc_pooled(black_box(24))))
        });
    }
    {
        let _hook = install(sink(true)).expect("install");
        g.bench_function("malloc + free, DebugPrintHook flushing", |b| {
            b.iter(|| drop(pool.malloc_pooled(black_box(24))));
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = direct, through_pool }
criterion_main!(benches);
