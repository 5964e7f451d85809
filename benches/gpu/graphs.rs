//! A captured graph against the same work captured by hand and issued eagerly.

use gpumem::core::{GraphOps, MemoryOps};
use gpumem::{DefaultBackend as B, Stream};

use crate::report::Report;
use crate::timing::{dev, device_ms, device_ms_pair};

#[cfg_attr(all(feature = "hip", not(feature = "cuda")), allow(unreachable_code, unused_variables))]
pub(crate) fn graphs(report: &mut Report) {
    const OPS: usize = 1000;
    const SIZE: usize = 64 << 10;
    eprintln!("graph of {OPS} memsets of {SIZE} bytes (ms per launch)");
    let s = Stream::non_blocking().unwrap();
    let buf = gpumem::alloc(OPS * SIZE).unwrap();
    let eager = device_ms(&s, || {
        for i in 0..OPS {
            (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s)).unwrap();
        }
    });
    // What keeping memory alive for queued work costs an eager operation: the same memsets
    // through the typed API and as raw driver calls, in one run.
    let (d, h) = (dev(), s.handle());
    let (typed, raw) = device_ms_pair(
        &s,
        || {
            for i in 0..OPS {
                (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s)).unwrap();
            }
        },
        || {
            for i in 0..OPS {
                // SAFETY: the range lies in `buf`, alive until the work is done (`device_ms_pair`
                // synchronises the stream).
                unsafe { B::memset_async(d, buf.ptr() + i * SIZE, i as u8, SIZE, h).unwrap() };
            }
        },
    );
    report.add(
        "transfers",
        format!("{OPS} eager memset_async of {SIZE} B, per operation"),
        typed * 1e3 / OPS as f64,
        "cuMemsetD8Async",
        Some(raw * 1e3 / OPS as f64),
        "us",
        true,
    );
    let typed_graph = (|| {
        s.begin_capture(None)?;
        for i in 0..OPS {
            (&buf + (i * SIZE) as isize).memset_async(i as u8, SIZE, Some(&s))?;
        }
        s.end_capture()
    })();
    let Ok(typed_graph) = typed_graph else {
        eprintln!("  (no capture on this backend: skipped)");
        return;
    };
    // SAFETY: `s` outlives every use of its handle `h` below.
    unsafe { B::begin_capture(d, h, gpumem::CaptureMode::Relaxed).unwrap() };
    for i in 0..OPS {
        // SAFETY: the range lies in `buf`, which outlives the graph's launches below.
        unsafe { B::memset_async(d, buf.ptr() + i * SIZE, i as u8, SIZE, h).unwrap() };
    }
    // SAFETY: as above.
    let raw_graph = unsafe { B::end_capture(d, h).unwrap() };
    let (replay, raw) = device_ms_pair(
        &s,
        || typed_graph.launch(Some(&s)).unwrap(),
        // SAFETY: as above.
        || unsafe { B::graph_launch(d, &raw_graph, h).unwrap() },
    );
    B::graph_destroy(d, raw_graph).unwrap();
    report.add(
        "graphs",
        "captured gpumem memsets, replay",
        replay,
        "the same, eager",
        Some(eager),
        "ms",
        true,
    );
    report.add(
        "graphs",
        "captured gpumem memsets, replay",
        replay,
        "raw driver calls captured by hand",
        Some(raw),
        "ms",
        true,
    );
}
