//! The `pytorch_import` fuzz target: [`gpumem_fuzz::pytorch_import::run`] on each input. Built by cargo-fuzz (with
//! `--cfg fuzzing`) it is a libFuzzer program; built plainly it runs the input files and the
//! files in the folders named on its command line, to reproduce a finding on stable Rust.

#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpumem_fuzz::pytorch_import::run(data));

#[cfg(not(fuzzing))]
fn main() -> std::process::ExitCode {
    gpumem_fuzz::corpus::run_named_files(gpumem_fuzz::pytorch_import::run)
}
