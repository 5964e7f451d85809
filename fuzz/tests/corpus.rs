//! Replays the stored inputs of every fuzz target on stable Rust, so that `cargo test` keeps what
//! fuzzing found fixed: `fuzz/corpus/<target>/` always, and `fuzz/open/<target>/` (inputs of
//! findings still open, which fail today) only with `GPUMEM_FUZZ_OPEN=1`. That variable also
//! turns on the checks and behaviours of the open findings, so stored inputs that reach them fail
//! then too.

use gpumem_fuzz::corpus::{dir, files_in};

fn replay(target: &str, run: fn(&[u8])) {
    let mut kinds = vec!["corpus"];
    if gpumem_fuzz::open_findings_on() {
        kinds.push("open");
    }
    let mut n = 0;
    for kind in kinds {
        for file in files_in(&dir(kind, target)) {
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            // The file's name is printed first, so that a panic names its input.
            println!("{}", file.display());
            run(&data);
            n += 1;
        }
    }
    assert!(n > 0, "no stored input for {target}");
}

#[test]
fn pool() {
    replay("pool", gpumem_fuzz::pool::run);
}

#[test]
fn cupy_import() {
    replay("cupy_import", gpumem_fuzz::cupy_import::run);
}

#[test]
fn pytorch_import() {
    replay("pytorch_import", gpumem_fuzz::pytorch_import::run);
}

#[test]
#[cfg_attr(
    any(feature = "cuda", feature = "hip"),
    ignore = "the C ABI's inputs drive the host backend; this build's default backend is a GPU's"
)]
fn capi() {
    replay("capi", gpumem_fuzz::capi::run);
}
