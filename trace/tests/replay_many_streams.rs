//! TR13: a trace with more streams than the host backend runs at once replays to an error, not
//! an abort. Its own test binary: the replay starts the host backend's most streams, which other
//! tests beside it would be refused.

use gpumem::host::Host;
use gpumem::GrowthPolicy;
use gpumem_trace::replay::{replay_on, Step, UntouchedHostMemory};
use gpumem_trace::Error;

#[test]
fn a_trace_with_twenty_thousand_streams_is_an_error() {
    let steps: Vec<Step> = (0..20_000).map(|i| Step::Alloc { id: i, size: 512, stream: i }).collect();
    let result =
        replay_on::<Host, _>(&steps, GrowthPolicy::HoldPeakInUse, 0, UntouchedHostMemory, &mut |_| {});
    match result {
        Err(Error::Pool(e)) => assert!(e.to_string().contains("streams are live"), "{e}"),
        other => panic!("{other:?}"),
    }
}
