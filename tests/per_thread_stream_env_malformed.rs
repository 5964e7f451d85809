//! A malformed `GPUMEM_PER_THREAD_DEFAULT_STREAM` is an error naming the variable, the value and
//! the accepted forms, reported by each new pool (EV07: `2` and non-UTF-8 values silently meant
//! off). A test binary of its own: the variable is read once per process.

use gpumem::core::Stream;
use gpumem::host::Host;

#[test]
fn a_malformed_value_is_reported_by_each_new_pool() {
    std::env::set_var(gpumem::core::PER_THREAD_DEFAULT_STREAM_ENV, "2");
    for _ in 0..2 {
        match gpumem::core::SingleDeviceMemoryPool::<Host>::new(0) {
            Err(gpumem::Error::InvalidEnvironment { variable, value, expected }) => {
                assert_eq!((variable, value.as_str()), (gpumem::core::PER_THREAD_DEFAULT_STREAM_ENV, "2"));
                assert!(expected.contains("yes") && expected.contains("off"), "{expected}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(gpumem::alloc(512).is_err());
    // The streams, which cannot fail, take it as off.
    assert!(Stream::<Host>::default_stream() == Stream::<Host>::null());
}
