//! gpumem's memory hooks: CuPy's `cupy.cuda.memory_hooks`.
//!
//! - [`DebugPrintHook`] prints one JSON line for each raw allocation, pool allocation and free,
//!   in CuPy's format to the byte, fast enough to leave on (tens of nanoseconds a line into a
//!   buffered writer).
//! - [`LineProfileHook`] attributes the bytes asked of the pool, and the bytes the pool took from
//!   the device, to the call sites along the user's call stack, and prints CuPy's report. It is
//!   behind the `line-profile` feature, on by default: it walks and symbolises the call stack
//!   with the `backtrace` crate. With `default-features = false` the crate has `DebugPrintHook`
//!   alone, and `LineProfileHook`, `ProfileEntry`, `StackFrame` and `humanized_size` are absent
//!   (a missing profiler is a compile error, never a profile that silently records nothing).
//! - [`Recorder`] writes every thread's operations, process-wide, as DebugPrintHook's lines with
//!   the stream, thread and time after CuPy's keys, and with
//!   [`Recorder::with_call_sites`] (the `line-profile` feature) each line's call site.
//!
//! A hook is installed on the calling thread with [`gpumem_core::hooks::install`] and removed
//! when the returned guard is dropped (where CuPy uses `with hook:`). The guard dereferences to the
//! hook, and [`HookGuard::into_inner`](gpumem_core::HookGuard::into_inner) gives it back with
//! what it recorded. Only the pools call hooks, and only on the thread that installed them.
//!
//! # Example
//!
//! CuPy's `DebugPrintHook` example: allocate the 24 bytes of a 3-element `int64` array from a
//! pool with the hook installed, then free them. The pool rounds the request to 512 bytes, takes
//! a new block from the device (`alloc`), lends it (`malloc`), and gets it back (`free`):
//!
//! ```
//! use gpumem_core::hooks::install;
//! use gpumem_core::host::Host;
//! use gpumem_core::MemoryPool;
//! use gpumem_hooks::DebugPrintHook;
//!
//! let pool = MemoryPool::<Host>::new();
//! let hook = install(DebugPrintHook::new(Vec::new()))?; // DebugPrintHook::stdout() prints
//! let x = pool.malloc(3 * std::mem::size_of::<i64>())?;
//! let ptr = x.ptr();
//! drop(x);
//! let out = String::from_utf8(hook.into_inner().into_inner()).unwrap();
//!
//! let lines: Vec<&str> = out.lines().collect();
//! assert_eq!(lines[0], format!(r#"{{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":{ptr}}}"#));
//! assert!(lines[1].starts_with(&format!(
//!     r#"{{"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":{ptr},"pmem_id":"0x"#
//! )));
//! assert!(lines[2].starts_with(&format!(
//!     r#"{{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":{ptr},"pmem_id":"0x"#
//! )));
//! assert_eq!(lines.len(), 3);
//! # Ok::<(), gpumem_core::Error>(())
//! ```
//!
//! which prints (addresses and ids differ from run to run):
//!
//! ```text
//! {"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
//! {"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
//! {"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
//! ```

#![deny(unsafe_code)]
// docs.rs marks the items that need a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without `line-profile` the docs still name LineProfileHook, which is then absent.
#![cfg_attr(not(feature = "line-profile"), allow(rustdoc::broken_intra_doc_links))]

mod debug_print;
#[cfg(feature = "line-profile")]
mod line_profile;
#[cfg(feature = "line-profile")]
mod line_tables;
mod recorder;
#[cfg(feature = "line-profile")]
mod site;
#[cfg(feature = "line-profile")]
mod stack;
#[cfg(feature = "line-profile")]
mod user_frame;

pub use debug_print::DebugPrintHook;
#[cfg(feature = "line-profile")]
pub use line_profile::{humanized_size, LineProfileHook, ProfileEntry};
pub use recorder::{Recorder, RecorderGuard};
#[cfg(feature = "line-profile")]
pub use stack::StackFrame;
