//! The call site of a recorded operation: the innermost frame of the calling thread's stack that
//! is the user's, as [`Recorder::with_call_sites`](crate::Recorder::with_call_sites) writes it.
//!
//! The frames are filtered as [`LineProfileHook`](crate::LineProfileHook) filters them (gpumem's
//! crates, the standard library, the test harness, the unwinder and foreign code are not the
//! user's). Only the innermost user frame is wanted, so the walk stops there: the frames below it
//! are the pool's and the hook's own, a dozen or so.
//!
//! Symbolising an address is dear (the first one loads the debug info, later ones take
//! microseconds), and the recorder is process-wide, so each distinct instruction pointer is
//! resolved once and its answer, "not the user's" or the site already written as a JSON string,
//! is kept in a map shared by every thread. A repeated call site then costs the stack walk and
//! one map lookup per frame walked.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};

use crate::user_frame::is_user_frame;

/// Finds call sites, caching what each instruction pointer resolves to.
#[derive(Default)]
pub(crate) struct SiteFinder {
    /// Crates whose frames are not the user's besides those `is_user_frame` always drops.
    skipped: Vec<String>,
    /// Instruction pointer -> its innermost user frame as a JSON string literal
    /// (`"file:line:function"`, quotes included), or `None` when none of its frames is the
    /// user's.
    by_ip: RwLock<HashMap<usize, Option<Arc<str>>>>,
}

impl SiteFinder {
    pub(crate) fn skip_crate(&mut self, name: String) {
        self.skipped.push(name);
        // Answers given before the change could name the crate now skipped.
        self.by_ip.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// The calling thread's call site, as a JSON string literal; `None` when no frame of the
    /// stack is the user's (a thread of a library, a binary without symbols).
    pub(crate) fn find(&self) -> Option<Arc<str>> {
        let mut site = None;
        backtrace::trace(|frame| {
            let ip = frame.ip() as usize;
            // A poisoned map only means a thread panicked while inserting; its entries are whole.
            let known = self.by_ip.read().unwrap_or_else(PoisonError::into_inner).get(&ip).cloned();
            let answer = known.unwrap_or_else(|| {
                let answer = self.resolve(frame);
                self.by_ip.write().unwrap_or_else(PoisonError::into_inner).insert(ip, answer.clone());
                answer
            });
            match answer {
                Some(s) => {
                    site = Some(s);
                    false
                }
                None => true,
            }
        });
        site
    }

    /// The innermost user frame of one stack frame (several symbols when calls were inlined,
    /// innermost first).
    #[cold]
    fn resolve(&self, frame: &backtrace::Frame) -> Option<Arc<str>> {
        let mut found: Option<String> = None;
        backtrace::resolve_frame(frame, |symbol| {
            if found.is_some() {
                return;
            }
            let Some(name) = symbol.name() else { return };
            let function = format!("{name:#}");
            let file = symbol.filename();
            if is_user_frame(&function, file, &self.skipped) {
                crate::line_tables::note(file.is_some(), symbol.lineno().is_some());
                let line = symbol.lineno().unwrap_or(0);
                let file = file.map_or_else(|| "??".into(), |f| f.display().to_string());
                found = Some(json_string(&format!("{file}:{line}:{function}")));
            }
        });
        found.map(Arc::from)
    }
}

/// `s` as a JSON string literal, quotes included.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // `write!` to a String cannot fail.
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape_what_json_requires() {
        assert_eq!(json_string("src/a.rs:3:app::f"), r#""src/a.rs:3:app::f""#);
        assert_eq!(json_string("C:\\x\"y\"\n\u{1}é"), r#""C:\\x\"y\"\n\u0001é""#);
    }

    #[test]
    fn frames_of_gpumem_and_std_are_no_site_and_are_cached() {
        // Every frame of this crate's unit tests is gpumem_hooks', std's or the harness's.
        let finder = SiteFinder::default();
        let mut cached = Vec::new();
        for _ in 0..2 {
            assert!(finder.find().is_none());
            cached.push(finder.by_ip.read().unwrap().len());
        }
        assert!(cached[0] > 3, "the walked frames are cached ({cached:?})");
        assert_eq!(cached[0], cached[1], "the second walk, from the same place, resolves nothing new");
        assert!(finder.by_ip.read().unwrap().values().all(Option::is_none));
    }
}
