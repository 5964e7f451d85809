//! The user's call stack at a hook event, as `(file, line, function)` frames.
//!
//! CuPy's `LineProfileHook` takes `traceback.extract_stack()` and drops its own file's frames;
//! the pool's frames are Cython and invisible to it. The Rust equivalent walks the native stack
//! ([`backtrace::trace`]) and symbolises each return address from the binary's debug info, then
//! drops the frames the user did not write: gpumem's crates (the hook, the dispatch, the pool),
//! the standard library (`std`, `core`, `alloc`, the test harness), the unwinder, and foreign
//! frames such as libc's thread start. `#[track_caller]` cannot do this job: hooks run inside
//! the pool, so `Location::caller()` there names a line of the pool.
//!
//! Walking the stack costs a few microseconds per event. Symbolising is far dearer (the first
//! one loads and parses the debug info, tens to hundreds of milliseconds; later ones take
//! microseconds per frame), so each distinct return address is symbolised once and its frames
//! are kept, already filtered and interned, in a map keyed by address.

use std::collections::HashMap;
use std::fmt;

/// One frame of a call stack: where a call was made.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackFrame {
    /// The source file, as the debug info names it; `??` when the binary has none for this
    /// frame (built without debug info, or stripped).
    pub file: String,
    /// The line of the call; 0 when unknown.
    pub line: u32,
    /// The function making the call, its Rust path without the symbol hash
    /// (`my_crate::module::function`, `<my_crate::Type>::method`, `...::{{closure}}`).
    pub function: String,
}

impl fmt::Display for StackFrame {
    /// CuPy's `filename:lineno:funcname`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.function)
    }
}

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

/// Captures call stacks, interning their frames.
#[derive(Default)]
pub(crate) struct StackCapture {
    /// Crates whose frames are dropped besides [`SKIPPED_CRATES`].
    skipped: Vec<String>,
    /// Every frame seen, by id.
    frames: Vec<StackFrame>,
    ids: HashMap<StackFrame, u32>,
    /// Return address -> the kept frames it resolves to (several when calls were inlined),
    /// innermost first.
    by_address: HashMap<usize, Box<[u32]>>,
    /// Scratch: the addresses of the current walk.
    addresses: Vec<usize>,
}

impl StackCapture {
    pub(crate) fn skip_crate(&mut self, name: String) {
        self.skipped.push(name);
        self.by_address.clear();
    }

    pub(crate) fn frame(&self, id: u32) -> &StackFrame {
        &self.frames[id as usize]
    }

    /// Replaces `out` with the ids of the calling thread's user frames, outermost first.
    pub(crate) fn capture(&mut self, out: &mut Vec<u32>) {
        out.clear();
        let mut addresses = std::mem::take(&mut self.addresses);
        addresses.clear();
        backtrace::trace(|frame| {
            addresses.push(frame.ip() as usize);
            true
        });
        for &address in &addresses {
            if !self.by_address.contains_key(&address) {
                let resolved = self.resolve(address);
                self.by_address.insert(address, resolved);
            }
            out.extend_from_slice(&self.by_address[&address]);
        }
        self.addresses = addresses;
        out.reverse();
    }

    /// The kept frames of one return address, innermost first.
    #[cold]
    fn resolve(&mut self, address: usize) -> Box<[u32]> {
        let mut found = Vec::new();
        backtrace::resolve(address as *mut std::ffi::c_void, |symbol| {
            let Some(name) = symbol.name() else { return };
            let function = format!("{name:#}");
            let file = symbol.filename().map(|p| p.display().to_string());
            if is_user_frame(&function, file.as_deref(), &self.skipped) {
                found.push(StackFrame {
                    file: file.unwrap_or_else(|| "??".to_owned()),
                    line: symbol.lineno().unwrap_or(0),
                    function,
                });
            }
        });
        found.into_iter().map(|frame| self.intern(frame)).collect()
    }

    fn intern(&mut self, frame: StackFrame) -> u32 {
        if let Some(&id) = self.ids.get(&frame) {
            return id;
        }
        let id = u32::try_from(self.frames.len()).expect("fewer than 2^32 distinct frames");
        self.frames.push(frame.clone());
        self.ids.insert(frame, id);
        id
    }
}

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
