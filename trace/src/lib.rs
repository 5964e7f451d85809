//! Allocation traces for gpumem: a file format, importers, a replay through gpumem's pool,
//! statistics and a timeline plot. The `gpumem-trace` program is a command line over this
//! library.
//!
//! ```text
//! gpumem-trace import --from cupy debug_print.jsonl -o run.trace
//! gpumem-trace import --from pytorch snapshot.pickle -o run.trace
//! gpumem-trace stats run.trace
//! gpumem-trace replay run.trace [--policy hold_peak_in_use]
//! gpumem-trace plot run.trace -o run.html        # or -o run.svg
//! ```
//!
//! # The trace format, version 1
//!
//! A trace is a text file of JSON lines, one per hook call, in the order the calls were made. It
//! is a superset of the lines CuPy's `DebugPrintHook` writes (and gpumem's
//! `gpumem::DebugPrintHook`, which writes the same bytes): **a DebugPrintHook file is a trace.**
//!
//! Each line is a JSON object. CuPy's keys come first, in CuPy's order:
//!
//! | key | type | lines | meaning |
//! |---|---|---|---|
//! | `hook` | string | all | `"alloc"` (a raw allocation), `"malloc"` (a pool allocation), `"free"` (a pool free), `"raw_free"` (a raw block given back; not in CuPy), or `"step"` (the end of an iteration of the program's loop, `gpumem_step`, or one the pool found with `gpumem_plan_automatically`: `mem_size` and `mem_ptr` 0; not in CuPy; `replay --plan` plans from these) |
//! | `device_id` | integer | all | the device |
//! | `size` | integer | `malloc` (CuPy); optional on `free` | bytes asked for |
//! | `mem_size` | integer | all | bytes allocated or freed, rounded to the allocator's unit |
//! | `mem_ptr` | integer | all | the address, in decimal; 0 for a failed allocation |
//! | `pmem_id` | string | `malloc`, `free` | the pool object's id, as Python's `hex()`: `"0x7f39200c5278"`; `"0x0"` for a failed `malloc` |
//!
//! Then any of these optional keys, in this order:
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `size` | integer | on a `free` line, the bytes that were asked for (on `malloc` lines `size` is in CuPy's place) |
//! | `phase` | `"pre"` or `"post"` | written before (`*_preprocess`) or after (`*_postprocess`) the operation; absent means `"post"`, which is all DebugPrintHook writes. Statistics, replay and plots read only `post` lines |
//! | `stream` | integer | the stream the operation was ordered on (its raw handle or a small number; 0 or absent is the null stream) |
//! | `thread` | integer | the calling thread |
//! | `time_ns` | integer | nanoseconds from an origin shared by the whole trace |
//! | `site` | string | where the operation was called from, `file:line:function` or any text: on a `malloc` line the allocation's call site (what `stats` ranks and `plot --color-by site` colours), on a `free` line where it was freed. `gpumem::Recorder::with_call_sites` writes it |
//!
//! Readers ignore keys they do not know, so later versions can add keys. The first line may be
//! a header, `{"gpumem_trace":1,"source":"pytorch","note":"..."}`, naming the format version
//! (a reader refuses a version newer than its own) and where the trace came from; files without
//! one are version 1.
//!
//! A `free` ends the live allocation with the same device, `mem_ptr` and `pmem_id` (so a free
//! written after another thread was already lent the same address ends the right one). A `free`
//! that matches none freed memory allocated before the trace began, and is counted as such. A
//! `malloc` that lends a live allocation's address and id again means its free line was lost:
//! the free is counted (`lost_frees`) and taken as made just before.
//!
//! ```
//! use gpumem_trace::{Timeline, Trace};
//!
//! let text = r#"{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
//! {"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
//! {"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278","stream":0,"time_ns":1200}
//! "#;
//! let trace = Trace::parse(text)?;
//! let stats = Timeline::new(&trace).stats(10)?;
//! assert_eq!((stats.peak_in_use, stats.peak_in_use_rounded, stats.raw_allocs), (24, 512, 1));
//! assert_eq!(trace.to_text(), text); // CuPy's lines are written back byte for byte
//! # Ok::<(), gpumem_trace::Error>(())
//! ```

pub mod analysis;
pub mod cli;
pub mod error;
pub mod format;
pub mod import;
pub mod plot;
pub mod recommend;
pub mod replay;

pub use analysis::{Allocation, Stats, Timeline};
pub use error::{Error, Result};
pub use format::{Event, Header, Hook, Phase, Trace, FORMAT_VERSION};
