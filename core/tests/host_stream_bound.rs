//! The host backend runs at most 1024 streams at once (HS01: 20 000 streams aborted the process
//! when the system could not set their threads up). Its own test binary: it holds every stream
//! the bound allows, which other tests beside it would be refused.

use gpumem_core::host::Host;
use gpumem_core::Stream;

#[test]
fn streams_past_the_bound_are_refused_with_an_error() {
    let mut streams = Vec::new();
    let refused = loop {
        match Stream::<Host>::non_blocking() {
            Ok(s) => streams.push(s),
            Err(e) => break e,
        }
        assert!(streams.len() <= 1024, "more than 1024 host streams were started");
    };
    assert_eq!(streams.len(), 1024);
    assert_eq!(refused.code(), Some(701), "{refused}");
    assert!(refused.to_string().contains("1024 streams are live"), "{refused}");

    // The streams still work, and one can be made again once some are gone.
    streams[0].synchronize().unwrap();
    streams.truncate(1000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // A destroyed stream's thread finishes its queue before it counts as gone.
    let again = loop {
        match Stream::<Host>::non_blocking() {
            Ok(s) => break s,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("no stream after 24 were dropped: {e}"),
        }
    };
    again.synchronize().unwrap();
}
