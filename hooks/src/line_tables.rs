//! A warning, once per process, when a call site comes without its file or line: the program was
//! built without line tables (Cargo's release profile drops them), so every site would read
//! `??:0:function` and a report would group unrelated allocations under one name.

use std::sync::atomic::{AtomicBool, Ordering};

/// What the warning says: the cause, and the one line of Cargo.toml that fixes it.
pub(crate) const WARNING: &str = "gpumem: call sites have no file or line (`??:0`): this build has no \
    line tables, as Cargo's release profile by default. Add `[profile.release] debug = \"line-tables-only\"` \
    to the application's Cargo.toml (or set CARGO_PROFILE_RELEASE_DEBUG=line-tables-only) to see them.";

static WARNED: AtomicBool = AtomicBool::new(false);

/// Notes a user frame as resolved; warns on standard error the first time one lacks its file or
/// line.
pub(crate) fn note(file_known: bool, line_known: bool) {
    if lacks_line_tables(file_known, line_known) && !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("{WARNING}");
    }
}

fn lacks_line_tables(file_known: bool, line_known: bool) -> bool {
    !(file_known && line_known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_without_file_or_line_is_what_warns() {
        assert!(!lacks_line_tables(true, true));
        assert!(lacks_line_tables(false, false));
        assert!(lacks_line_tables(true, false));
        assert!(WARNING.contains("??:0") && WARNING.contains("debug = \"line-tables-only\""));
    }
}
