//! gpumem's conformance suite: one body of tests, written against the facade, run on whichever
//! backend the build selects (`cargo test` on the host, `cargo test --features cuda` on an NVIDIA
//! GPU).
//!
//! On a GPU build every test here is marked ignored, so a machine without the device shows them as
//! skipped instead of passing; the GPU machine runs them with `--include-ignored`, and there a test
//! that finds no device fails.

mod allocator;
mod capture;
mod common;
mod devices;
mod events;
mod memory;
mod pinned;
mod pool;
mod streams;
