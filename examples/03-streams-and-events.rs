//! Streams and events: two streams ordered with an event, timing with events, host functions,
//! and the runtime's stream-ordered pool (`MemoryAsyncPool`, CuPy's name).
//!
//! `cargo run --example 03-streams-and-events` (host backend; `--features cuda` on an NVIDIA
//! GPU). It prints what each stream saw and the pool's statistics.

use std::sync::{Arc, Mutex};

use gpumem::{Event, EventFlags, Limit, MemoryAsyncPool, Stream};

fn main() -> gpumem::Result<()> {
    let producer = Stream::non_blocking()?;
    let consumer = Stream::non_blocking()?;
    let p = gpumem::alloc(1 << 20)?;

    // The producer fills the buffer; the consumer waits for the producer's event, then copies.
    let start = Event::new()?;
    start.record(Some(&producer))?;
    p.memset_async(0xab, 1 << 20, Some(&producer))?;
    let filled = producer.record(None)?;
    consumer.wait_event(&filled)?;
    let q = gpumem::alloc(1 << 20)?;
    q.copy_from_device_async(&p, 1 << 20, Some(&consumer))?;

    // Host functions run in stream order, after the work queued before them.
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    consumer.launch_host_func(move || l.lock().unwrap().push("the consumer's copy is done"))?;
    let end = consumer.record(None)?;
    consumer.synchronize()?;
    let mut first = [0u8; 4];
    q.copy_to_host(&mut first, 4)?;
    println!("consumer read {first:02x?} after waiting for the producer's event");
    println!("host function: {:?}", log.lock().unwrap());
    println!("producer start to consumer end: {:.3} ms", gpumem::get_elapsed_time(&start, &end)?);

    // An event without timing cannot be timed: an error, not a garbage figure.
    let untimed = Event::with_flags(EventFlags { disable_timing: true, ..EventFlags::default() })?;
    untimed.record(Some(&consumer))?;
    untimed.synchronize()?;
    if let Err(e) = gpumem::get_elapsed_time(&start, &untimed) {
        println!("timing an untimed event: {e}");
    }

    // The runtime's stream-ordered pool: allocations and frees ordered on the current stream.
    let pool = MemoryAsyncPool::new()?;
    let _on_consumer = consumer.enter()?;
    let a = pool.malloc(3000)?; // rounded to 3072
    a.memset_async(1, 3000, None)?;
    println!(
        "MemoryAsyncPool: {} bytes used, {} held, limit {} (0: unlimited)",
        pool.used_bytes()?,
        pool.total_bytes()?,
        pool.get_limit()?
    );
    pool.set_limit(Limit::Bytes(pool.total_bytes()?.max(4096)))?;
    match pool.malloc(pool.free_bytes()? + (1 << 20)) {
        Err(e) => println!("past the limit: {e}"),
        Ok(_) => println!("past the limit: allocated (the runtime held more than asked)"),
    }
    pool.set_limit(Limit::Bytes(0))?;
    drop(a); // freed on the consumer stream, after the memset
    pool.free_all_blocks(None)?;
    println!(
        "after the free and free_all_blocks: {} bytes used, {} held",
        pool.used_bytes()?,
        pool.total_bytes()?
    );
    Ok(())
}
