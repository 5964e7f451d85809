//! Graph capture: a stream's work recorded once and replayed with one launch, as CuPy's
//! `stream.begin_capture()` / `end_capture()` / `graph.launch()`, and the graph printed as DOT
//! (`Graph::debug_dot_str`).
//!
//! `cargo run --example 05-graph-capture` (host backend, which records and replays the work;
//! `--features cuda` on an NVIDIA GPU, where the driver builds the graph and prints its DOT).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpumem::Stream;

fn main() -> gpumem::Result<()> {
    let s = Stream::non_blocking()?;
    let a = gpumem::alloc(1024)?;
    let b = gpumem::alloc(1024)?;
    let replays = Arc::new(AtomicUsize::new(0));

    s.begin_capture(None)?;
    a.memset_async(0x11, 1024, Some(&s))?;
    (&a + 512).memset_async(0x22, 512, Some(&s))?;
    b.copy_from_device_async(&a, 1024, Some(&s))?;
    let r = replays.clone();
    s.launch_host_func(move || {
        r.fetch_add(1, Ordering::SeqCst);
    })?;
    let graph = s.end_capture()?;
    println!("captured; nothing ran yet: host function ran {} times", replays.load(Ordering::SeqCst));

    // Synchronous work is refused while a stream captures (CuPy's message).
    s.begin_capture(None)?;
    {
        let _current = s.enter()?;
        if let Err(e) = a.memset(0, 8) {
            println!("a synchronous memset during capture: {e}");
        }
    }
    drop(s.end_capture());

    for round in 1..=3 {
        b.memset(0, 1024)?;
        graph.launch(Some(&s))?;
        s.synchronize()?;
        let mut out = [0u8; 1024];
        b.copy_to_host(&mut out, 1024)?;
        println!(
            "replay {round}: b[0] = {:#04x}, b[1023] = {:#04x}, host function ran {} times",
            out[0],
            out[1023],
            replays.load(Ordering::SeqCst)
        );
    }

    // The graph keeps what its work touches: dropping `a` and `b` now frees nothing the graph
    // can still reach until the graph itself is dropped.
    drop((a, b));
    graph.launch(Some(&s))?;
    s.synchronize()?;
    println!("replayed again after the program dropped its pointers");

    println!("the graph as DOT:\n{}", graph.debug_dot_str(0)?);
    Ok(())
}
