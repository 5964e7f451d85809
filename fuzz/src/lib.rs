//! gpumem's fuzz targets, as functions of the input bytes that panic on a finding:
//!
//! - [`pool`]: the pool driven by a sequence of allocations, frees, limits, policy changes,
//!   `free_all_blocks`, expandable segments and raw-allocator behaviours (out of memory, refused
//!   or partial growth and shrinking), checked after every step against a reference model.
//! - [`cupy_import`] and [`pytorch_import`]: the trace importers on arbitrary bytes, then the
//!   analyses over what they accept.
//! - [`capi`]: the C ABI's entry points on the host backend, with arbitrary sizes, devices,
//!   stream handles, addresses, limits and policy names.
//!
//! `fuzz_targets/` wraps each for libFuzzer (`scripts/fuzz.sh`); [`corpus`] replays the inputs
//! kept in `fuzz/corpus/` (tests/corpus.rs, so `cargo test` runs them on stable Rust). Inputs that
//! reproduce a finding still open are kept in `fuzz/open/` and replayed only with
//! `GPUMEM_FUZZ_OPEN=1`, which also turns on the behaviours that reach them.

pub mod capi;
pub mod corpus;
pub mod cupy_import;
pub mod pool;
pub mod pytorch_import;
mod trace_checks;

/// Whether the behaviours that reach findings still open are on (`GPUMEM_FUZZ_OPEN=1`): a raw
/// allocator whose `grow` answers `Ok(true)` without growing (VM07), lending across streams
/// (`used_bytes` with shared chunks).
#[must_use]
pub fn open_findings_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("GPUMEM_FUZZ_OPEN").is_some_and(|v| v == "1"))
}

/// Whether the targets print each operation they run (`GPUMEM_FUZZ_PRINT=1`): to read what a
/// stored input does, `GPUMEM_FUZZ_PRINT=1 cargo run -p gpumem-fuzz --bin pool -- FILE`.
#[must_use]
pub fn print_ops() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("GPUMEM_FUZZ_PRINT").is_some_and(|v| v == "1"))
}
