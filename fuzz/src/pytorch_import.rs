//! PyTorch's snapshot import on arbitrary bytes (a pickle, or anything): a typed error or a
//! trace that passes the importer checks.

use gpumem_trace::import;

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    match import::pytorch(data) {
        Ok((trace, report)) => {
            assert_eq!(report.events, trace.events.len(), "the report's event count");
            crate::trace_checks::check(&trace);
        }
        Err(e) => drop(e.to_string()),
    }
}
