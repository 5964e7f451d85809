//! Asking the legacy stream whether it captures while a blocking stream does: CUDA answers
//! `STREAM_CAPTURE_IMPLICIT` and leaves the capture as it was (probed on an H200, CUDA 13). The
//! host backend does the same.
//!
//! A test binary of its own: while a blocking stream captures, every legacy-stream operation of
//! the process fails, so no other test may run beside it.

use gpumem_core::host::Host;
use gpumem_core::Stream;

#[test]
fn a_legacy_capture_query_leaves_a_blocking_capture_alone() {
    let blocking = Stream::<Host>::new().unwrap();
    blocking.begin_capture(None).unwrap();
    for legacy in [Stream::<Host>::null(), Stream::<Host>::legacy()] {
        let err = legacy.is_capturing().unwrap_err();
        assert_eq!(err.code(), Some(906), "{err:?}");
    }
    assert!(blocking.is_capturing().unwrap(), "the capture survives the query");
    blocking.end_capture().unwrap();
    assert!(!Stream::<Host>::null().is_capturing().unwrap());

    // A non-blocking capture does not concern the legacy stream at all.
    let non_blocking = Stream::<Host>::non_blocking().unwrap();
    non_blocking.begin_capture(None).unwrap();
    assert!(!Stream::<Host>::null().is_capturing().unwrap());
    assert!(non_blocking.is_capturing().unwrap());
    non_blocking.end_capture().unwrap();
}
