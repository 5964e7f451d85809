//! What stream safety costs an eager operation: `memset_async` and `copy_from_device_async`
//! through the typed API, on the memory's own stream and on another one, each beside the raw
//! driver call and the raw call followed by one event record (what an order between two streams
//! needs at least), in one run. Two more anchors record each operation into an event of a ring
//! ([`RINGS`]), as gpumem records each kept operation into an event of its own and reuses them
//! once their entries are released (at most every 256 entries): what recording into many events,
//! rather than one, costs the driver.

use gpumem::core::{EventFlags, EventOps, MemoryOps};
use gpumem::{DefaultBackend as B, MemoryPointer, Stream};

use crate::report::Report;
use crate::timing::{dev, device_ms_pair};

const OPS: usize = 1000;
const SIZE: usize = 64 << 10;
/// The events the ring anchors record into in turn (gpumem records each kept operation into an
/// event of its own, and reuses those of released entries: up to 256 entries wait before a
/// release).
const RINGS: [usize; 2] = [32, 256];

/// What the raw anchor records after each operation.
#[derive(Clone, Copy)]
enum Record {
    Nothing,
    OneEvent,
    Ring(usize),
}

#[cfg_attr(all(feature = "hip", not(feature = "cuda")), allow(unreachable_code, unused_variables))]
pub(crate) fn stream_safety(report: &mut Report) {
    eprintln!("stream safety: {OPS} eager operations of {SIZE} B (us per operation)");
    let s = Stream::non_blocking().unwrap();
    // Lent by the pool of `s` (its own stream) and by the default stream's (another stream).
    let own = {
        s.use_stream().unwrap();
        let pair = (gpumem::alloc(OPS * SIZE).unwrap(), gpumem::alloc(OPS * SIZE).unwrap());
        Stream::null().use_stream().unwrap();
        pair
    };
    let other = (gpumem::alloc(OPS * SIZE).unwrap(), gpumem::alloc(OPS * SIZE).unwrap());
    let (d, h) = (dev(), s.handle());
    let flags = EventFlags { disable_timing: true, ..EventFlags::default() };
    let event = B::event_create(d, flags).unwrap();
    let rings: Vec<Vec<_>> =
        RINGS.iter().map(|&n| (0..n).map(|_| B::event_create(d, flags).unwrap()).collect()).collect();
    let event_of = |record: Record, i: usize| match record {
        Record::Nothing => None,
        Record::OneEvent => Some(&event),
        Record::Ring(r) => Some(&rings[r][i % RINGS[r]]),
    };
    for (whose, (dst, src)) in [("its own stream", &own), ("another stream", &other)] {
        let at = |p: &MemoryPointer, i: usize| p + (i * SIZE) as isize;
        let memset = || {
            for i in 0..OPS {
                at(dst, i).memset_async(i as u8, SIZE, Some(&s)).unwrap();
            }
        };
        let raw_memset = |record: Record| {
            for i in 0..OPS {
                // SAFETY: the range lies in `dst`, alive until the work is done (`device_ms_pair`
                // synchronises the stream); `h` is the live stream `s`.
                unsafe {
                    B::memset_async(d, dst.ptr() + i * SIZE, i as u8, SIZE, h).unwrap();
                    if let Some(e) = event_of(record, i) {
                        B::event_record(d, e, h).unwrap();
                    }
                }
            }
        };
        let copy = || {
            for i in 0..OPS {
                at(dst, i).copy_from_device_async(&at(src, i), SIZE, Some(&s)).unwrap();
            }
        };
        let raw_copy = |record: Record| {
            for i in 0..OPS {
                // SAFETY: as above, for both ranges.
                unsafe {
                    B::memcpy_async(d, dst.ptr() + i * SIZE, src.ptr() + i * SIZE, SIZE, h).unwrap();
                    if let Some(e) = event_of(record, i) {
                        B::event_record(d, e, h).unwrap();
                    }
                }
            }
        };
        let per_op = |ms: f64| ms * 1e3 / OPS as f64;
        let records =
            [Record::Nothing, Record::OneEvent].into_iter().chain((0..RINGS.len()).map(Record::Ring));
        for record in records {
            let plus = match record {
                Record::Nothing => String::new(),
                Record::OneEvent => " + cuEventRecord".to_owned(),
                Record::Ring(r) => format!(" + cuEventRecord, a ring of {} events", RINGS[r]),
            };
            let (ours, raw) = device_ms_pair(&s, memset, || raw_memset(record));
            report.add(
                "stream safety",
                format!("eager memset_async of {SIZE} B, memory of {whose}, per operation"),
                per_op(ours),
                format!("cuMemsetD8Async{plus}"),
                Some(per_op(raw)),
                "us",
                true,
            );
            let (ours, raw) = device_ms_pair(&s, copy, || raw_copy(record));
            report.add(
                "stream safety",
                format!("eager copy_from_device_async of {SIZE} B, memory of {whose}, per operation"),
                per_op(ours),
                format!("cuMemcpyAsync{plus}"),
                Some(per_op(raw)),
                "us",
                true,
            );
        }
    }
    B::event_destroy(d, event).unwrap();
    for e in rings.into_iter().flatten() {
        B::event_destroy(d, e).unwrap();
    }
}
