//! Declares `cfg(fuzzing)`, which cargo-fuzz sets, so that the compiler knows it.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fuzzing)");
}
