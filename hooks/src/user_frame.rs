//! Whose code a frame of the call stack is: the user's, or that of gpumem, the standard library,
//! the unwinder or foreign code, which LineProfileHook and the Recorder's call sites leave out.

/// The crates whose frames are never shown: the standard library, the test harness, the
/// unwinder and gpumem itself.
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
];

/// Where the standard library's sources are said to be in the debug info of a released
/// toolchain.
const STD_SOURCE_PREFIX: &str = "/rustc/";

/// Whether a frame is the user's: a Rust function (its name is a path) outside the skipped
/// crates and outside the standard library's sources. Foreign frames (`start_thread`, `_start`,
/// `__libc_start_main`, the C `main` that rustc emits) have no path and are dropped.
pub(crate) fn is_user_frame(function: &str, file: Option<&str>, skipped: &[String]) -> bool {
    if file.is_some_and(|f| f.starts_with(STD_SOURCE_PREFIX)) {
        return false;
    }
    match crate_of(function) {
        Some(krate) => !SKIPPED_CRATES.contains(&krate) && !skipped.iter().any(|s| s == krate),
        None => false,
    }
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

    #[test]
    fn user_frames_exclude_gpumem_std_and_foreign_code() {
        let none: &[String] = &[];
        let src = Some("/work/app/src/main.rs");
        assert!(is_user_frame("my_app::main", src, none));
        assert!(is_user_frame("my_app::main", None, none), "kept without debug info");
        assert!(!is_user_frame("gpumem_core::hooks::fire", Some("/work/gpumem/core/src/hooks.rs"), none));
        assert!(!is_user_frame(
            "<gpumem_hooks::LineProfileHook as gpumem_core::hooks::MemoryHook>::malloc_preprocess",
            src,
            none
        ));
        assert!(!is_user_frame("std::rt::lang_start::{{closure}}", src, none));
        assert!(!is_user_frame("test::run_test", None, none));
        assert!(!is_user_frame("backtrace::backtrace::trace", src, none));
        assert!(!is_user_frame(
            "my_app::Thing::call_once",
            Some("/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs"),
            none
        ));
        assert!(!is_user_frame("start_thread", Some("./nptl/pthread_create.c"), none));
        let wrappers = vec!["my_arrays".to_owned()];
        assert!(!is_user_frame("my_arrays::Array::zeros", src, &wrappers));
        assert!(is_user_frame("my_app::main", src, &wrappers));
    }
}
