//! Whose code a frame of the call stack is: the user's, or that of gpumem, the standard library,
//! the unwinder or foreign code, which LineProfileHook and the Recorder's call sites leave out.
//!
//! A frame comes with its function's name and, given debug info, its source file. Where the name
//! is a Rust path (`my_app::model::step`), its first segment is the crate. But the debug info of
//! `debug = "line-tables-only"` (a common setting for release builds that want backtraces) names
//! functions without their path (`step`) wherever it describes them: every inlined call, and every
//! function that calls were inlined into (in an optimised build, nearly all); only the addresses
//! it says nothing of are named from the symbol table, by whole paths. One build thus gives both
//! kinds of names, so the file is judged first, whatever the name:
//!
//! - the standard library's sources are under `/rustc/<commit>/` in a released toolchain's debug
//!   info;
//! - each of gpumem's library crates has its sources in the `src` directory of its package, an
//!   absolute path when it is compiled, and the debug info's file names are absolute paths
//!   ([`is_gpumem_source`] says how each directory is known);
//! - a crate from a registry lies in a directory `<package>-<version>`, which names it: the
//!   unwinder (`backtrace`) is told so, and so is a crate given to `skip_crate` that comes from a
//!   registry.
//!
//! A frame in none of these is then judged by its name: by its crate where the name is a path,
//! and where it is not, by its file: a Rust file (`.rs`) is the user's (their crates, tests,
//! examples and benches, gpumem's own `tests/` directories included), a file of another language
//! (libc's `.c`) is foreign, and so is a frame with no file.
//!
//! The files keep these places unless the build remaps source paths (`--remap-path-prefix`);
//! names with paths are judged by their crate all the same.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// The crates whose frames are never shown: the standard library, the test harness, the
/// unwinder and gpumem itself. Matched against the first segment of a function's path, and
/// against the directory of a crate from a registry.
const SKIPPED_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "test",
    "proc_macro",
    "backtrace",
    "gpumem",
    "gpumem_core",
    "gpumem_hooks",
    "gpumem_cuda",
    "gpumem_hip",
    "gpumem_capi",
];

/// Where the standard library's sources are said to be in the debug info of a released
/// toolchain.
const STD_SOURCES: &str = "/rustc";

/// gpumem's library crates that this crate does not depend on and whose frames can be on the
/// stack above the pool at a hook event or a recorded operation, by crate name and by the place
/// of their sources in gpumem's repository: the facade's functions (`gpumem::alloc` and its kin)
/// wrap the pool's, the backends' trampolines run the callbacks and host functions queued on
/// streams, and the C ABI's functions wrap the pool's. gpumem-auto is not among them: it only
/// forwards the backend calls the pool makes, whose frames are gone by the time a hook runs.
const REPOSITORY_CRATES: &[(&str, &str)] = &[
    ("gpumem", "src"),
    ("gpumem_cuda", "backend-cuda/src"),
    ("gpumem_hip", "backend-hip/src"),
    ("gpumem_capi", "capi/src"),
];

/// Whether a frame is the user's: a Rust function outside the standard library's sources,
/// gpumem's and those of the crates skipped (`skipped` besides [`SKIPPED_CRATES`]), as the
/// module's docs say. A frame named without a path and without a Rust source file is foreign
/// (`start_thread`, `_start`, `__libc_start_main`, the C `main` that rustc emits) and dropped.
pub(crate) fn is_user_frame(function: &str, file: Option<&Path>, skipped: &[String]) -> bool {
    let is_skipped = |krate: &str| SKIPPED_CRATES.contains(&krate) || skipped.iter().any(|s| s == krate);
    if let Some(file) = file {
        if file.starts_with(STD_SOURCES)
            || is_gpumem_source(file)
            || packaged_crate(file).is_some_and(|krate| is_skipped(&krate))
        {
            return false;
        }
    }
    match crate_of(function) {
        Some(krate) => !is_skipped(krate),
        None => file.is_some_and(|f| f.extension().is_some_and(|e| e == "rs")),
    }
}

/// Whether `file` is a source of one of gpumem's library crates.
///
/// Two directories are known exactly, wherever their packages are: this crate's own, and
/// gpumem-core's ([`gpumem_core::SOURCE_DIR`]), whose pool calls every hook and so is on every
/// stack walked. The crates of [`REPOSITORY_CRATES`] are not dependencies of this one, so their
/// directories can only be inferred: built from gpumem's repository ([`repository`]) they are
/// where the repository puts them, and from a registry their `<package>-<version>` directories
/// name them (they are in [`SKIPPED_CRATES`]). Elsewhere (`cargo vendor` without
/// `--versioned-dirs`) their frames named without a path are taken for the user's.
fn is_gpumem_source(file: &Path) -> bool {
    static DIRECTORIES: LazyLock<Vec<PathBuf>> = LazyLock::new(|| {
        let hooks = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut directories = vec![hooks.join("src"), PathBuf::from(gpumem_core::SOURCE_DIR)];
        if let Some(repository) = repository() {
            directories.extend(REPOSITORY_CRATES.iter().map(|(_, sources)| repository.join(sources)));
        }
        directories
    });
    DIRECTORIES.iter().any(|directory| file.starts_with(directory))
}

/// gpumem's repository, where this crate and gpumem-core were built from one (gpumem as a path
/// or git dependency, or gpumem's own workspace): the directory holding both packages, as its
/// `hooks` and `core`. Without both, the directory above this package is someone else's (a
/// registry's, a vendor directory, a workspace this crate was copied into), whose `src` may well
/// be the user's.
fn repository() -> Option<&'static Path> {
    let hooks = Path::new(env!("CARGO_MANIFEST_DIR"));
    let core = Path::new(gpumem_core::SOURCE_DIR).parent()?;
    let repository = hooks.parent()?;
    (hooks.file_name()? == "hooks" && core == repository.join("core")).then_some(repository)
}

/// The crate whose sources hold `file`, where its package directory is named
/// `<package>-<version>`: as cargo unpacks a registry's crates
/// (`$CARGO_HOME/registry/src/<index>/<package>-<version>/src/...`) and as `cargo vendor
/// --versioned-dirs` lays them out. The crate's name is the package's with `_` for `-`; a library
/// that renames itself in its manifest (`[lib] name`) is not recognised by its directory.
fn packaged_crate(file: &Path) -> Option<String> {
    let mut found = None;
    let mut parent: Option<&OsStr> = None;
    for part in file.components().map(|c| c.as_os_str()) {
        if part == "src" {
            if let Some(package) = parent.and_then(OsStr::to_str).and_then(package_of) {
                found = Some(package.replace('-', "_"));
            }
        }
        parent = Some(part);
    }
    found
}

/// The package of a directory named `<package>-<version>`: the name before the first `-` that a
/// version follows (`sha-1-0.10.6` is `sha-1`'s).
fn package_of(directory: &str) -> Option<&str> {
    directory
        .match_indices('-')
        .map(|(at, _)| at)
        .find(|&at| at > 0 && is_version(&directory[at + 1..]))
        .map(|at| &directory[..at])
}

/// Whether `s` is a semantic version: `MAJOR.MINOR.PATCH`, then a pre-release (`-rc.1`) or build
/// (`+abc`) part if any.
fn is_version(s: &str) -> bool {
    let release = s.split(['-', '+']).next().unwrap_or(s);
    let numbers: Vec<&str> = release.split('.').collect();
    numbers.len() == 3 && numbers.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The crate a demangled Rust function belongs to: the first segment of its path, or, for
/// `<Type as Trait>::method` and `<Type>::method`, of the type's path. `None` when the name is
/// not a Rust path.
pub(crate) fn crate_of(function: &str) -> Option<&str> {
    let mut s = function;
    loop {
        let trimmed = s.trim_start_matches(['<', '&', '*', '(', '[', ' ']);
        let trimmed = ["mut ", "const ", "dyn "].iter().fold(trimmed, |t, p| t.strip_prefix(p).unwrap_or(t));
        if trimmed.len() == s.len() {
            break;
        }
        s = trimmed;
    }
    let head = &s[..s.find("::")?];
    let is_ident = !head.is_empty()
        && head.chars().all(|c| c == '_' || c.is_alphanumeric())
        && !head.starts_with(|c: char| c.is_ascii_digit());
    is_ident.then_some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crate_of_reads_the_first_path_segment() {
        for (name, krate) in [
            ("my_app::main", Some("my_app")),
            ("my_app::train::step::{{closure}}", Some("my_app")),
            ("<my_app::Model as my_app::Layer>::forward", Some("my_app")),
            ("<gpumem_core::pool::SingleDeviceMemoryPool<B>>::malloc", Some("gpumem_core")),
            ("gpumem_core::pool::SingleDeviceMemoryPool<B>::malloc_hooked", Some("gpumem_core")),
            ("<&mut my_app::Buf as std::io::Write>::write", Some("my_app")),
            ("<[my_app::X] as core::fmt::Debug>::fmt", Some("my_app")),
            ("<alloc::boxed::Box<dyn core::ops::FnOnce<()>> as core::ops::FnOnce<()>>::call_once", Some("alloc")),
            ("<fn() -> core::result::Result<(), alloc::string::String> as core::ops::FnOnce<()>>::call_once", None),
            ("main", None),
            ("start_thread", None),
            ("clone3", None),
            ("", None),
        ] {
            assert_eq!(crate_of(name), krate, "{name}");
        }
    }

    /// `is_user_frame` with the file as text.
    fn user(function: &str, file: Option<&str>, skipped: &[String]) -> bool {
        is_user_frame(function, file.map(Path::new), skipped)
    }

    /// Whether this crate is built from gpumem's repository, told apart from [`repository`]'s
    /// way: the directory above this package holds the facade's manifest.
    fn in_repository() -> bool {
        let above = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("a package directory has a parent");
        std::fs::read_to_string(above.join("Cargo.toml"))
            .is_ok_and(|manifest| package_name(&manifest) == Some("gpumem"))
    }

    /// The package name a manifest declares first.
    fn package_name(manifest: &str) -> Option<&str> {
        manifest.lines().find_map(|l| l.strip_prefix("name = \"")).and_then(|l| l.strip_suffix('"'))
    }

    /// Cargo's directory for crates.io's crates.
    const REGISTRY: &str = "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";

    #[test]
    fn user_frames_exclude_gpumem_std_and_foreign_code() {
        let none: &[String] = &[];
        let src = Some("/work/app/src/main.rs");
        assert!(user("my_app::main", src, none));
        assert!(user("my_app::main", None, none), "kept without debug info");
        assert!(!user("gpumem_core::hooks::fire", Some("/work/gpumem/core/src/hooks.rs"), none));
        assert!(!user(
            "<gpumem_hooks::LineProfileHook as gpumem_core::hooks::MemoryHook>::malloc_preprocess",
            src,
            none
        ));
        assert!(!user("std::rt::lang_start::{{closure}}", src, none));
        assert!(!user("test::run_test", None, none));
        assert!(!user("backtrace::backtrace::trace", src, none));
        assert!(!user("gpumem_capi::pool::malloc", None, none));
        assert!(!user(
            "my_app::Thing::call_once",
            Some("/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs"),
            none
        ));
        assert!(!user("start_thread", Some("./nptl/pthread_create.c"), none));
        let wrappers = vec!["my_arrays".to_owned()];
        assert!(!user("my_arrays::Array::zeros", src, &wrappers));
        assert!(user("my_app::main", src, &wrappers));
    }

    #[test]
    fn names_without_a_path_are_judged_by_their_file() {
        let none: &[String] = &[];
        let at = |dir: &Path, file: &str| dir.join(file).to_str().expect("a UTF-8 path").to_owned();
        let hooks = Path::new(env!("CARGO_MANIFEST_DIR"));
        let core = Path::new(gpumem_core::SOURCE_DIR);

        // The user's: their own crate, and the tests of gpumem's crates.
        assert!(user("cupy_test_print_report", Some(&at(hooks, "tests/line_profile.rs")), none));
        assert!(user("step", Some("/work/app/src/model.rs"), none));
        assert!(user("{closure#0}<my_app::Model>", Some("/work/app/src/model.rs"), none));
        // gpumem's: this crate and the pool.
        assert!(!user("malloc_preprocess", Some(&at(hooks, "src/line_profile.rs")), none));
        assert!(!user("malloc<gpumem_core::host::Host>", Some(&at(core, "runtime/pools/mod.rs")), none));
        // From gpumem's repository, the facade's and a backend's too; by directory, not by prefix.
        if let Some(repository) = repository() {
            assert!(!user("alloc", Some(&at(repository, "src/lib.rs")), none));
            assert!(!user("callback_trampoline", Some(&at(repository, "backend-cuda/src/stream.rs")), none));
            assert!(user("main", Some(&at(repository, "examples/04-hooks-and-profiling.rs")), none));
            assert!(user("f", Some(&at(repository, "src-gen/lib.rs")), none));
        }
        // The standard library's, foreign code, no file.
        assert!(!user(
            "{closure#0}<()>",
            Some("/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/rt.rs"),
            none
        ));
        assert!(!user("__libc_start_call_main", Some("./csu/../sysdeps/nptl/libc_start_call_main.h"), none));
        assert!(!user("cupy_test_print_report", None, none));
        assert!(!user("main", None, none));
        // Registry crates: skipped ones (the unwinder, gpumem's, the user's) by directory.
        let registry = Path::new(REGISTRY);
        let unwinder = at(registry, "backtrace-0.3.77/src/backtrace/libunwind.rs");
        assert!(!user(
            "trace_unsynchronized<backtrace::capture::{impl#0}::create::{closure_env#0}>",
            Some(&unwinder),
            none
        ));
        assert!(!user("alloc", Some(&at(registry, "gpumem-0.1.0/src/lib.rs")), none));
        assert!(!user("malloc", Some(&at(registry, "gpumem-core-0.1.0/src/runtime/pools.rs")), none));
        let arrays = at(registry, "my-arrays-1.2.0-rc.1/src/lib.rs");
        assert!(user("zeros", Some(&arrays), none));
        let wrappers = vec!["my_arrays".to_owned()];
        assert!(!user("zeros", Some(&arrays), &wrappers));
        assert!(
            !user("<my_app::Model as my_arrays::Fill>::fill", Some(&arrays), &wrappers),
            "a path names the type's crate; the file is the skipped crate's"
        );
        assert!(user("step", Some("/work/app/src/model.rs"), &wrappers));
    }

    #[test]
    fn versioned_directories_name_their_crate() {
        for (file, krate) in [
            ("/r/backtrace-0.3.77/src/lib.rs", Some("backtrace")),
            ("/r/gpumem-core-0.1.0/src/pool/mod.rs", Some("gpumem_core")),
            ("/r/sha-1-0.10.6/src/lib.rs", Some("sha_1")),
            ("/r/my-arrays-1.2.0-rc.1/src/lib.rs", Some("my_arrays")),
            ("/r/x-1.0.0+build.5/src/lib.rs", Some("x")),
            ("/home/src/proj/foo-2.0.0/src/a/b.rs", Some("foo")),
            // Not a package directory: no version, not one followed by `src`, or not a version.
            ("/work/app/src/main.rs", None),
            ("/r/backtrace-0.3.77/build.rs", None),
            ("/r/x-1.0/src/lib.rs", None),
            ("/r/x-1.0.a/src/lib.rs", None),
            ("/r/-1.0.0/src/lib.rs", None),
            ("/work/release-2024.01.02/app/src/main.rs", None),
        ] {
            assert_eq!(packaged_crate(Path::new(file)).as_deref(), krate, "{file}");
        }
    }

    /// Built from gpumem's repository, [`repository`] finds it, and the places
    /// [`REPOSITORY_CRATES`] gives there are those crates' packages; each of them is skipped by
    /// name too, for their copies from a registry.
    #[test]
    fn repository_crates_are_where_the_repository_puts_them() {
        for &(krate, _) in REPOSITORY_CRATES {
            assert!(SKIPPED_CRATES.contains(&krate), "{krate}");
        }
        if !Path::new(env!("CARGO_MANIFEST_DIR")).exists() {
            // The test binary runs away from the sources it was built from (copied to another
            // machine): there is no layout to read.
            eprintln!("the sources this test was built from are not on this machine: not checked");
            return;
        }
        assert_eq!(repository().is_some(), in_repository());
        let Some(repository) = repository() else {
            eprintln!("not built from gpumem's repository: its layout is not checked");
            return;
        };
        for &(krate, sources) in REPOSITORY_CRATES {
            let package = repository.join(sources).parent().expect("sources in a package").join("Cargo.toml");
            let manifest =
                std::fs::read_to_string(&package).unwrap_or_else(|e| panic!("{}: {e}", package.display()));
            let name =
                package_name(&manifest).unwrap_or_else(|| panic!("no package name in {}", package.display()));
            assert_eq!(name.replace('-', "_"), krate, "{}", package.display());
        }
    }
}
