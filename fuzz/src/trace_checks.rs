//! What the importer targets check on every trace an importer accepts.

use gpumem_trace::plot::{self, PlotOptions};
use gpumem_trace::replay::{self, Step};
use gpumem_trace::{Error, Hook, Timeline, Trace};

/// Checks an imported trace: it reads back as written (the same events), its statistics are computed or refused
/// with [`Error::Overflow`], its replay steps hold every allocation and every free once, each
/// free after its allocation, and it can be plotted.
pub(crate) fn check(trace: &Trace) {
    // A `malloc` line is written with its `size` (CuPy's keys), the requested size where the
    // line read had none: the same event.
    let mut written = trace.clone();
    for e in &mut written.events {
        if e.kind() == Hook::Malloc {
            e.size = Some(e.requested());
        }
    }
    let again = Trace::parse(&trace.to_text()).expect("a trace gpumem-trace wrote reads back");
    assert_eq!(again, written, "the trace changed through writing and reading back");

    let timeline = Timeline::new(trace);
    match timeline.stats(8) {
        Ok(stats) => drop(stats.render()),
        Err(Error::Overflow(_)) => {}
        Err(e) => panic!("stats: an error other than an overflow: {e}"),
    }

    let steps = replay::steps(&timeline);
    let mut live = std::collections::HashSet::new();
    let (mut allocs, mut frees) = (0, 0);
    for step in &steps {
        match *step {
            Step::Alloc { id, .. } => {
                assert!(live.insert(id), "allocation {id} replayed twice");
                allocs += 1;
            }
            Step::Free { id } => {
                assert!(live.remove(&id), "free of {id} replayed before its allocation or twice");
                frees += 1;
            }
        }
    }
    assert_eq!(allocs, timeline.allocations.len(), "allocations missing from the replay steps");
    let ended = timeline.allocations.iter().filter(|a| a.end.is_some()).count();
    assert_eq!(frees, ended, "frees missing from the replay steps");
    let _ = replay::peak_in_use(&steps);

    if !timeline.allocations.is_empty() {
        let options = PlotOptions { max_bands: 16, ..PlotOptions::default() };
        match plot::layout(&timeline, &options) {
            Ok(layout) => {
                drop(plot::svg(&layout));
                drop(plot::html(&layout));
            }
            Err(Error::Overflow(_)) => {}
            Err(e) => panic!("plot: {e}"),
        }
    }
}
