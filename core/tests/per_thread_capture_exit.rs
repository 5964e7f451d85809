//! A thread that exits while its per-thread default stream captures: gpumem ends the capture
//! and discards its graph, so what the capture kept goes back (on CUDA this also keeps the
//! driver from meeting a per-thread stream torn down while it captures).
//!
//! A test binary of its own: while the per-thread stream (a blocking one) captures, every
//! legacy-stream operation of the process fails, so no other test may run beside it.

use gpumem_core::host::Host;
use gpumem_core::{MemoryPool, Stream};

#[test]
fn an_abandoned_per_thread_capture_is_ended_when_its_thread_exits() {
    const N: usize = 4096;
    let pool = MemoryPool::<Host>::new();
    std::thread::scope(|scope| {
        // Joined explicitly: that waits for the thread's exit, its thread-locals' destruction
        // included (the scope's own join may return before).
        let exiting = scope.spawn(|| {
            let s = Stream::<Host>::per_thread();
            s.begin_capture(None).unwrap();
            let p = pool.malloc(N).unwrap();
            p.memset_async(1, N, Some(&s)).unwrap();
            drop(p);
            assert_eq!(pool.used_bytes(), N, "the capture keeps the chunk");
        });
        exiting.join().unwrap();
    });
    assert_eq!(pool.used_bytes(), 0, "the thread's exit ended the capture and dropped its graph");
    // Legacy-stream work runs again.
    let q = pool.malloc(N).unwrap();
    q.memset(2, N).unwrap();
}
