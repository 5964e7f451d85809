//! The choice as a program sees it: `GPUMEM_BACKEND` read from the process's environment, the
//! probes, and the typed layer running on what was chosen.

use std::process::Command;

use gpumem_auto::{chosen, Auto};
use gpumem_core::{Device, Error, MemoryPool};

/// Whether `GPUMEM_REQUIRE_DEVICE=1` is set (the GPU runners set it).
fn device_required() -> bool {
    std::env::var("GPUMEM_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1")
}

/// The GPU backends this build has.
fn built_in() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "cuda") {
        names.push("cuda");
    }
    if cfg!(feature = "hip") {
        names.push("hip");
    }
    names
}

/// Checks the choice against this process's `GPUMEM_BACKEND`, then runs a pool allocation on
/// it. Run as is (the variable as the caller set it), and by the next test in child processes
/// with each kind of value.
#[test]
fn the_choice_follows_the_environment() {
    let value = std::env::var("GPUMEM_BACKEND").ok();
    let choice = chosen();
    eprintln!("GPUMEM_BACKEND={value:?}: {:?}", choice.as_ref().map(|c| c.name()));
    match value.as_deref().map(str::trim) {
        Some("host") => assert_eq!(choice.expect("host is always built in").name(), "host"),
        Some(name @ ("cuda" | "hip")) => {
            let compiled = built_in().contains(&name);
            match choice {
                Ok(c) => assert!(compiled && c.name() == name, "{name} asked for, {} chosen", c.name()),
                Err(Error::InvalidEnvironment { variable: "GPUMEM_BACKEND", value, .. }) => {
                    assert!(!compiled && value == name, "{value}");
                    return;
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        None | Some("") => {
            let c = choice.expect("with the variable unset a backend is always chosen");
            // On a GPU runner a GPU backend must win; elsewhere the host does unless a probe
            // found a device.
            if device_required() {
                assert_ne!(c.name(), "host", "GPUMEM_REQUIRE_DEVICE=1, but the host backend was chosen");
            }
        }
        Some(other) => {
            match choice {
                Err(Error::InvalidEnvironment { variable: "GPUMEM_BACKEND", value, expected }) => {
                    assert_eq!(value, other);
                    assert!(expected.contains("cuda, hip or host"), "{expected}");
                }
                unexpected => panic!("GPUMEM_BACKEND={other:?} gave {unexpected:?}"),
            }
            // Every operation answers the same error, and none panics.
            assert!(matches!(Device::<Auto>::count(), Err(Error::InvalidEnvironment { .. })));
            assert!(matches!(MemoryPool::<Auto>::new().malloc(256), Err(Error::InvalidEnvironment { .. })));
            return;
        }
    }
    // The typed layer runs on the choice.
    let n = Device::<Auto>::count().expect("the chosen backend has a device");
    assert!(n >= 1);
    let pool = MemoryPool::<Auto>::new();
    let p = pool.malloc(1024).expect("malloc");
    p.memset(7, 1024).expect("memset");
    let mut out = [0u8; 4];
    p.copy_to_host(&mut out, 4).expect("copy_to_host");
    assert_eq!(out, [7; 4]);
}

/// Runs the test above in a fresh process (the choice is made once per process) for each kind
/// of value: a backend name, padded, empty, and malformed ones.
#[test]
fn each_kind_of_value_in_a_fresh_process() {
    let exe = std::env::current_exe().expect("the test binary's path");
    for value in ["host", " host\n", "", "rocm", "CUDA", "cuda,hip"] {
        let out = Command::new(&exe)
            .args(["--exact", "the_choice_follows_the_environment", "--test-threads=1", "--nocapture"])
            .env("GPUMEM_BACKEND", value)
            // The child checks the choice only; on a GPU runner "host" is what it asked for.
            .env_remove("GPUMEM_REQUIRE_DEVICE")
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "GPUMEM_BACKEND={value:?}: {}\n{stdout}\n{stderr}",
            out.status
        );
    }
}
