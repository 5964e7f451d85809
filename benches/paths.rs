//! The hot paths one at a time, for counting instructions (`valgrind --tool=cachegrind`) and for a
//! quick timing of each on any backend.
//!
//! ```text
//! cargo bench -p gpumem-benches --bench paths                # ns per pair of every path
//! target/release/deps/paths-* pointer 100000                 # only that path, that many pairs
//! ```
//!
//! Instructions per pair: run one path with two counts under cachegrind and divide the difference
//! of the `I refs` totals by the difference of the counts (`scripts/count-instructions.sh`). The
//! arena lock is chosen at build time: `--features parking-lot-arena-lock` builds the same paths
//! under parking_lot's mutex.

#![allow(missing_docs)]

use std::cell::Cell;
use std::hint::black_box;
use std::io::{self, BufWriter};
use std::time::Instant;

use gpumem::core::hooks::Callbacks;
use gpumem::core::pool::ARENA_LOCK;
use gpumem::core::{FreeEvent, HookResult, MallocEvent, MemoryHook};
use gpumem::{
    alloc, get_allocator, hooks, DebugPrintHook, DeviceBuffer, MemoryPointer, SingleDeviceMemoryPool, Stream,
};

type Path = (&'static str, &'static str);

const PATHS: [Path; 8] = [
    ("pooled", "pool cache hit (malloc_pooled + drop)"),
    ("pointer", "MemoryPointer cache hit (malloc + drop)"),
    ("arc", "MemoryPointer over an Arc (from_memory(malloc_pooled))"),
    ("alloc", "alloc + drop (the default pool through the current allocator)"),
    ("get_allocator", "get_allocator().malloc + drop"),
    ("buffer", "DeviceBuffer<f32> of 128 from alloc + drop"),
    ("hooked", "pool cache hit, DebugPrintHook on a BufWriter"),
    ("dispatch", "pool cache hit, a hook that only reads its events"),
];

/// A hook with DebugPrintHook's callbacks that only reads each event's address: the cost of
/// dispatching the events, without formatting or writing lines.
#[derive(Default)]
struct PostprocessOnly(Cell<usize>);

impl MemoryHook for PostprocessOnly {
    fn name(&self) -> &str {
        "PostprocessOnly"
    }
    fn callbacks(&self) -> Callbacks {
        Callbacks::POSTPROCESS
    }
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.0.set(self.0.get() ^ e.mem_ptr);
        Ok(())
    }
    fn free_postprocess(&self, e: &FreeEvent) -> HookResult {
        self.0.set(self.0.get() ^ e.mem_ptr);
        Ok(())
    }
}

fn run(path: &str, pool: &SingleDeviceMemoryPool, n: u64) {
    match path {
        "pooled" => (0..n).for_each(|_| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap()))),
        "pointer" => (0..n).for_each(|_| drop(black_box(pool.malloc(black_box(512)).unwrap()))),
        "arc" => (0..n).for_each(|_| {
            drop(black_box(MemoryPointer::from_memory(pool.malloc_pooled(black_box(512)).unwrap())));
        }),
        "alloc" => (0..n).for_each(|_| drop(black_box(alloc(black_box(512)).unwrap()))),
        "get_allocator" => {
            (0..n).for_each(|_| drop(black_box(get_allocator().malloc(black_box(512)).unwrap())))
        }
        "buffer" => (0..n).for_each(|_| {
            let p = alloc(black_box(512)).unwrap();
            drop(black_box(DeviceBuffer::<f32>::from_pointer(p, 128).unwrap()));
        }),
        "hooked" => {
            let _hook =
                hooks::install(DebugPrintHook::with_flush(BufWriter::new(io::sink()), false)).unwrap();
            (0..n).for_each(|_| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())));
        }
        "dispatch" => {
            let _hook = hooks::install(PostprocessOnly::default()).unwrap();
            (0..n).for_each(|_| drop(black_box(pool.malloc_pooled(black_box(512)).unwrap())));
        }
        other => panic!("unknown path {other}; the paths: {:?}", PATHS.map(|p| p.0)),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let pool = SingleDeviceMemoryPool::new(gpumem::Device::current().id()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let _g = stream.enter().unwrap();
    // Warm every arena and cache the paths use (the default pool's too).
    for (p, _) in PATHS {
        run(p, &pool, 10);
    }
    if let [path, n] = args.as_slice() {
        run(path, &pool, n.parse().expect("a count"));
        return;
    }
    // ns per pair: the median of 11 rounds, the paths interleaved round by round.
    let mut samples = vec![Vec::new(); PATHS.len()];
    for _ in 0..11 {
        for (i, (p, _)) in PATHS.iter().enumerate() {
            let t = Instant::now();
            run(p, &pool, 200_000);
            samples[i].push(t.elapsed().as_nanos() as f64 / 200_000.0);
        }
    }
    println!("arena lock: {ARENA_LOCK}");
    for ((_, what), s) in PATHS.iter().zip(&mut samples) {
        s.sort_by(f64::total_cmp);
        println!("{:>8.1} ns  {what}", s[s.len() / 2]);
    }
}
