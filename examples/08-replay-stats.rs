//! Replays an allocation trace through gpumem's pool on the default backend and prints the
//! pool's `memory_summary()`; optionally records the replay with the process-wide `Recorder`
//! (a trace `gpumem-trace` reads, plots and replays).
//!
//! The trace is the text format `bench/record_training_trace.py` writes (`a <id> <size>
//! <stream>`, `f <id>`, `# step N`), e.g. GPT-2's training steps; `synthetic` replays the
//! benchmark's synthetic training loop instead. `scripts/torch_replay_summary.py` replays the same
//! file through PyTorch's caching allocator, for `torch.cuda.memory_summary()` beside this one.
//!
//! `cargo run --release --example 08-replay-stats -- [TRACE|synthetic] [--record OUT.jsonl]`
//! (host backend), with `--features cuda` on an NVIDIA GPU. Without a trace it replays a small
//! training loop.

use std::collections::HashMap;
use std::io::BufWriter;

use gpumem::core::pool::trace::{self, Step};
use gpumem::{Recorder, SingleDeviceMemoryPool, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let record = args.iter().position(|a| a == "--record").and_then(|i| args.get(i + 1));
    let steps: Vec<Step> = match args.first().map(String::as_str) {
        Some("synthetic") => trace::training(12, 768, 4096, 3),
        Some(option) if option.starts_with("--") && option != "--record" => {
            return Err(format!(
                "unknown option {option:?}; usage: 08-replay-stats [TRACE|synthetic] [--record OUT.jsonl]"
            )
            .into());
        }
        Some(path) if path != "--record" => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("reading the trace {path:?}: {e}"))?;
            trace::parse(&text)?
        }
        // No trace named: a small training loop (4 layers, 2 steps), so the example runs as is.
        _ => trace::training(4, 256, 1024, 2),
    };
    let pool = SingleDeviceMemoryPool::new(0)?;
    // The trace's stream 0 is the null stream; each other number a stream of its own.
    let mut streams: HashMap<usize, Stream> = HashMap::new();
    let recorder = match record {
        Some(path) => Some(Recorder::new(BufWriter::new(std::fs::File::create(path)?)).install()),
        None => None,
    };
    let mut live = HashMap::new();
    let start = std::time::Instant::now();
    for step in &steps {
        match *step {
            Step::Alloc { id, size, stream } => {
                let p = if stream == 0 {
                    pool.malloc_pooled(size)?
                } else {
                    let s = match streams.entry(stream) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => e.insert(Stream::non_blocking()?),
                    };
                    let _on = s.enter()?;
                    pool.malloc_pooled(size)?
                };
                live.insert(id, p);
            }
            Step::Free { id } => drop(live.remove(&id)),
        }
    }
    let elapsed = start.elapsed();
    let summary = pool.memory_summary();
    drop(live);
    if let Some(r) = recorder {
        let lines = r.lines();
        r.finish()?;
        eprintln!("recorded {lines} lines");
    }
    let backend = <gpumem::DefaultBackend as gpumem::core::Api>::NAME;
    println!("{} steps replayed in {:.1} ms on {backend}", steps.len(), elapsed.as_secs_f64() * 1e3);
    println!("{summary}");
    Ok(())
}
