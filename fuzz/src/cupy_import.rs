//! CuPy's DebugPrintHook import on arbitrary bytes, lenient and strict: a typed error or a trace
//! that passes the importer checks; what the strict import accepts, the lenient one accepts alike.

use gpumem_trace::import;

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    let lenient = import::cupy(data, false);
    let strict = import::cupy(data, true);
    if let Ok((trace, report)) = &lenient {
        assert_eq!(report.events, trace.events.len(), "the report's event count");
        crate::trace_checks::check(trace);
    }
    if let Ok((trace, _)) = &strict {
        let (lenient_trace, _) = lenient.as_ref().expect("a strict import succeeded, the lenient one failed");
        assert_eq!(lenient_trace, trace, "the lenient import read another trace than the strict one");
    }
    // Errors are typed and printable.
    for e in [lenient.err(), strict.err()].into_iter().flatten() {
        drop(e.to_string());
    }
}
