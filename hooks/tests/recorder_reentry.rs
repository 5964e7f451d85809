//! A [`Recorder`] whose writer allocates through gpumem (RC03): the writer's own operations are
//! skipped and counted, and the program goes on. Its own test binary: the recorder sees every
//! thread of the process, so no other test may run beside it.

use std::io::Write;
use std::sync::mpsc;
use std::time::Duration;

use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
use gpumem_hooks::Recorder;

/// A writer that allocates (and frees) 512 bytes through gpumem on every write.
struct AllocatingWriter {
    out: Vec<u8>,
}

impl Write for AllocatingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        drop(gpumem_core::alloc::<Host>(512).map_err(std::io::Error::other)?);
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_writer_that_allocates_through_gpumem_does_not_hang() {
    let (done, finished) = mpsc::channel();
    // On a thread of its own, so that a hang fails the test instead of stalling it.
    std::thread::spawn(move || {
        let guard = Recorder::new(AllocatingWriter { out: Vec::new() }).install();
        let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
        drop(pool.malloc_pooled(1024).unwrap());
        let skipped = guard.skipped();
        let lines = guard.lines();
        let out = String::from_utf8(guard.finish().unwrap().out).unwrap();
        done.send((lines, skipped, out)).unwrap();
    });
    let (lines, skipped, out) =
        finished.recv_timeout(Duration::from_secs(60)).expect("recording with an allocating writer hung");
    // The pool's own operations are recorded: its raw allocation, the malloc and the free.
    assert_eq!(lines, 3, "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("\"hook\":\"malloc\",\"device_id\":0,\"size\":1024,"), "{out}");
    assert!(!out.contains("\"size\":512,"), "a writer's allocation was recorded:\n{out}");
    // Each write made a malloc and a free of its own (and raw calls where the writer's pool
    // missed): none is recorded, each is counted.
    assert!(skipped >= 6, "skipped {skipped}");
}
