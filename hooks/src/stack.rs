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

use crate::user_frame::is_user_frame;

/// One frame of a call stack: where a call was made.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackFrame {
    /// The source file, as the debug info names it; `??` when the binary has none for this
    /// frame (built without debug info, or stripped).
    pub file: String,
    /// The line of the call; 0 when unknown.
    pub line: u32,
    /// The function making the call, its Rust path without the symbol hash
    /// (`my_crate::module::function`, `<my_crate::Type>::method`, `...::{{closure}}`), or, where
    /// the debug info names it without its path (`debug = "line-tables-only"`), its name alone
    /// (`function`, `method`, `{closure#0}`).
    pub function: String,
}

impl fmt::Display for StackFrame {
    /// CuPy's `filename:lineno:funcname`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.function)
    }
}

/// Captures call stacks, interning their frames.
#[derive(Default)]
pub(crate) struct StackCapture {
    /// Crates whose frames are dropped besides those `is_user_frame` always drops.
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
            let file = symbol.filename();
            if is_user_frame(&function, file, &self.skipped) {
                crate::line_tables::note(file.is_some(), symbol.lineno().is_some());
                found.push(StackFrame {
                    file: file.map_or_else(|| "??".to_owned(), |f| f.display().to_string()),
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
