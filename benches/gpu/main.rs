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
//! cargo bench -p gpumem-benches --features cuda --bench gpu                  # on an NVIDIA GPU
//! cargo bench -p gpumem-benches --bench gpu                                  # the same program on the host backend
//! cargo bench -p gpumem-benches --bench gpu -- --write-trace random.trace    # the random trace, for the anchors
//! cargo bench -p gpumem-benches --bench gpu -- --write-seeds DIR [N]         # the other seeds' (or 1..=N) traces
//! cargo bench -p gpumem-benches --bench gpu -- --replay-host TRACE           # gpumem's figures without a device
//! cargo bench -p gpumem-benches --bench gpu -- --replay-seeds                # the same for every other seed
//! cargo bench -p gpumem-benches --bench gpu -- --sweep-seeds 50              # seeds 1..=50: each policy's spread
//! ```
//!
//! Nothing here asserts a timing: the output is a report.

#![allow(missing_docs)]

mod allocation;
mod fragmentation;
mod graphs;
mod hook_costs;
mod report;
mod stream_safety;
mod threads;
mod timing;
mod transfers;

use gpumem::core::pool::trace;
use std::io::Write as _;
use std::time::Instant;

use crate::allocation::allocation;
use crate::fragmentation::{
    fragmentation, later_steps, print_host_replays, print_seed_sweep, seed_steps, seed_trace, POLICIES,
};
use crate::graphs::graphs;
use crate::hook_costs::{arena_lock, hook_costs};
use crate::report::{Anchors, Report};
use crate::stream_safety::stream_safety;
use crate::threads::threads;
use crate::timing::on_bench_cpu;
use crate::transfers::{pageable, transfers};
use gpumem::DefaultBackend as B;

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
        // The other seeds' traces, already on one stream, for the anchors to replay; with a
        // count N, seeds 1 to N (for bench/seed_sweep.py).
        let dir = args.get(i + 1).expect("--write-seeds DIR [N]");
        let seeds: Vec<u64> = match args.get(i + 2).and_then(|n| n.parse::<u64>().ok()) {
            Some(n) => (1..=n).collect(),
            None => trace::OTHER_SEEDS.to_vec(),
        };
        for seed in seeds {
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
    if let Some(i) = args.iter().position(|a| a == "--sweep-seeds") {
        // What one seed's figure is worth: each policy over many seeds, without a device.
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).expect("--sweep-seeds N (a count)");
        print_seed_sweep(n);
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
    if run("stream_safety") {
        stream_safety(&mut report);
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
