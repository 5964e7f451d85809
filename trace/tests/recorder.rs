//! A trace recorded by gpumem's process-wide [`Recorder`] from two threads on two streams reads
//! back and replays to the figures the pool itself reported. Its own test binary: the recorder
//! sees every thread of the process, so no other test may run beside it.

use std::sync::{Arc, Mutex};

use gpumem::core::{SingleDeviceMemoryPool, Stream};
use gpumem::host::Host;
use gpumem::{GrowthPolicy, Recorder};
use gpumem_trace::replay::{self, ReplayOptions};
use gpumem_trace::{Hook, Timeline, Trace};

#[test]
fn two_threads_on_two_streams_replay_to_the_pools_own_peaks() {
    let pool = Arc::new(SingleDeviceMemoryPool::<Host>::new(0).unwrap());
    // Each operation and its line happen under this lock, so the trace's order is the pool's.
    let turn = Arc::new(Mutex::new(()));
    let recording = Recorder::new(Vec::new()).install();
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (pool, turn) = (Arc::clone(&pool), Arc::clone(&turn));
            std::thread::spawn(move || {
                let stream = Stream::<Host>::non_blocking().unwrap();
                let _on = stream.enter().unwrap();
                let mut live = Vec::new();
                for i in 0..40u64 {
                    let _g = turn.lock().unwrap();
                    let size = 1000 + ((i * 7919 + t * 104_729) % 300_000) as usize;
                    live.push(pool.malloc_pooled(size).unwrap());
                    if i % 3 == 2 {
                        drop(live.remove((i as usize * 5) % live.len()));
                    }
                }
                let _g = turn.lock().unwrap();
                live.clear();
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let stats = pool.stats();
    pool.free_all_blocks(None);
    let after = pool.stats();
    let bytes = recording.finish().unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let trace = Trace::parse(&text).unwrap();

    // Every line is CuPy's keys first, then the stream, thread and time.
    let first_malloc = text.lines().find(|l| l.starts_with("{\"hook\":\"malloc\"")).unwrap();
    let keys: Vec<&str> = first_malloc.split(',').map(|kv| kv.split(':').next().unwrap()).collect();
    let cupy = ["{\"hook\"", "\"device_id\"", "\"size\"", "\"mem_size\"", "\"mem_ptr\"", "\"pmem_id\""];
    assert_eq!(keys[..6], cupy);
    assert_eq!(keys[6..], ["\"stream\"", "\"thread\"", "\"time_ns\""]);
    let threads = |hook: Hook| -> std::collections::BTreeSet<u64> {
        trace.events.iter().filter(|e| e.kind() == hook).filter_map(|e| e.thread).collect()
    };
    assert_eq!(threads(Hook::Malloc).len(), 2, "both threads recorded");
    // The main thread's free_all_blocks gave the raw blocks back.
    assert!(threads(Hook::RawFree).is_disjoint(&threads(Hook::Malloc)));

    let s = Timeline::new(&trace).stats(0).unwrap();
    assert_eq!(s.mallocs, 80);
    assert_eq!(s.frees, 80);
    assert_eq!(s.mallocs, stats.all.allocations.allocated);
    assert_eq!(s.raw_allocs, after.all.segments.allocated);
    assert_eq!(s.raw_frees, after.all.segments.freed);
    assert_eq!(s.peak_held, stats.all.reserved_bytes.peak, "the reserved peak is exact");
    // Per stream, the arena's own peaks are exact; the pool-wide one is their bound.
    assert_eq!(s.streams.len(), 2);
    for st in &s.streams {
        let arena = stats.arenas.iter().find(|a| a.arena.raw() == st.stream).expect("the stream's arena");
        assert_eq!(st.peak_in_use, arena.stats.requested_bytes.peak, "stream {:#x}", st.stream);
        assert_eq!(st.mallocs, arena.stats.allocations.allocated);
    }
    assert!(!stats.peaks_exact);
    assert!(s.peak_in_use <= stats.all.requested_bytes.peak);
    assert!(s.peak_in_use >= stats.arenas.iter().map(|a| a.stats.requested_bytes.peak).max().unwrap());

    // Replayed through gpumem-trace's pool with the same policy: the same raw traffic.
    let steps = replay::steps(&Timeline::new(&trace));
    let r = replay::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory, ReplayOptions::default()).unwrap();
    assert_eq!(r.peak_in_use, s.peak_in_use);
    assert_eq!(r.peak_held, stats.all.reserved_bytes.peak);
    assert_eq!(r.raw_allocs, stats.all.segments.allocated);
    assert!(trace.events.iter().any(|e| e.kind() == Hook::RawFree));
}
