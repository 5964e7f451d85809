//! A per-thread default stream captured while other threads queue work on the legacy stream,
//! and a thread that exits while its per-thread stream captures. A test binary of its own: while a blocking stream captures, every legacy-stream operation of
//! the process fails, so no other test may run beside it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpumem_core::{Memory, MemoryPointer, MemoryPool, Stream};
use gpumem_cuda::Cuda;

mod support;
use support::{read_back, require_gpu};

/// A per-thread default stream captured while other threads queue work on the legacy stream:
/// CUDA invalidates such a capture (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), and every call must
/// answer with an error, never crash. Then a thread that leaves its per-thread stream capturing
/// when it exits. Repeated, with a host function and a memset captured each round.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn per_thread_captures_beside_legacy_work_fail_cleanly() {
    use std::sync::atomic::AtomicBool;
    require_gpu();
    const N: usize = 1 << 16;
    let stop = AtomicBool::new(false);
    let pool = MemoryPool::<Cuda>::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let target = MemoryPointer::from_memory(Memory::<Cuda>::new(N).expect("malloc"));
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let legacy = MemoryPointer::from_memory(Memory::<Cuda>::new(N).expect("malloc"));
                while !stop.load(Ordering::Relaxed) {
                    // Legacy-stream work; refused while a blocking stream captures, which is fine.
                    let _ = legacy.memset(1, N);
                }
            });
        }
        for _ in 0..200 {
            let s = Stream::<Cuda>::per_thread();
            if s.begin_capture(None).is_err() {
                continue;
            }
            let r = Arc::clone(&ran);
            let _ = s.launch_host_func(move || {
                r.fetch_add(1, Ordering::SeqCst);
            });
            let _ = target.memset_async(2, N, Some(&s));
            if let Ok(graph) = s.end_capture() {
                let _ = graph.launch(Some(&s));
                let _ = s.synchronize();
            }
            assert!(!matches!(s.is_capturing(), Ok(true)), "end_capture ends the capture either way");
        }
        // A thread whose per-thread stream is still capturing when it exits: gpumem ends the
        // capture and discards its graph first (CUDA 580's driver crashes when this legacy work
        // meets a per-thread stream torn down while capturing).
        let pool = &pool;
        scope
            .spawn(move || {
                let s = Stream::<Cuda>::per_thread();
                if s.begin_capture(None).is_ok() {
                    let p = pool.malloc(N).expect("malloc");
                    let _ = p.memset_async(3, N, Some(&s));
                    let _ = s.launch_host_func(|| {});
                }
            })
            .join()
            .expect("the capturing thread exits");
        assert_eq!(pool.used_bytes(), 0, "the abandoned capture's graph gave its memory back");
        stop.store(true, Ordering::Relaxed);
    });
    // The device is still usable.
    target.memset(4, N).expect("memset after the rounds");
    assert!(read_back(&target, N).iter().all(|&x| x == 4));
}
