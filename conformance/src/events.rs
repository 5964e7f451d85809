//! Events: flags, record, done, synchronize, elapsed time, ordering between streams.

/// The `events` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __events_tests {
    ($flavor:ident) => {
        mod events {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::{Error, Event, EventFlags, Stream};


            conformance! {
                fn interprocess_events_need_timing_disabled() {
                    let bad = Event::with_flags(EventFlags { interprocess: true, ..EventFlags::default() });
                    assert_eq!(bad.unwrap_err().to_string(), "invalid argument: Timing must be disabled for interprocess events");
                    Event::with_flags(EventFlags { blocking: true, disable_timing: true, interprocess: false }).unwrap();
                }

                fn record_synchronize_and_elapsed_time() {
                    let s = Stream::new().unwrap();
                    let start = s.record(None).unwrap();
                    let p = gpumem::alloc(1 << 20).unwrap();
                    p.memset_async(1, 1 << 20, Some(&s)).unwrap();
                    let end = Event::new().unwrap();
                    s.record(Some(&end)).unwrap();
                    end.synchronize().unwrap();
                    assert!(start.done() && end.done());
                    let ms = gpumem::get_elapsed_time(&start, &end).unwrap();
                    assert!(ms >= 0.0, "{ms}");
                    let untimed = Event::with_flags(EventFlags { disable_timing: true, ..EventFlags::default() }).unwrap();
                    untimed.record(Some(&s)).unwrap();
                    assert!(matches!(gpumem::get_elapsed_time(&start, &untimed), Err(Error::InvalidArgument(_))));
                    assert!(Event::new().unwrap().done(), "an event never recorded is done");
                }

                fn wait_event_orders_two_streams() {
                    let producer = Stream::non_blocking().unwrap();
                    let consumer = Stream::non_blocking().unwrap();
                    let a = gpumem::alloc(1 << 16).unwrap();
                    let b = gpumem::alloc(1 << 16).unwrap();
                    for round in 0..20u8 {
                        a.memset_async(round, 1 << 16, Some(&producer)).unwrap();
                        let ready = producer.record(None).unwrap();
                        consumer.wait_event(&ready).unwrap();
                        b.copy_from_device_async(&a, 1 << 16, Some(&consumer)).unwrap();
                        consumer.synchronize().unwrap();
                        assert!($crate::read(&b, 1 << 16).iter().all(|&x| x == round));
                    }
                }

                fn record_defaults_to_the_current_stream() {
                    let s = Stream::new().unwrap();
                    let _g = s.enter().unwrap();
                    let e = Event::new().unwrap();
                    e.record(None).unwrap();
                    e.synchronize().unwrap();
                    assert!(e.done());
                }
            }
        }
    };
}
