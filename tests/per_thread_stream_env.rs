//! `GPUMEM_PER_THREAD_DEFAULT_STREAM` is a flag like every other (EV07: `yes`, `on` and `true`
//! meant off). A test binary of its own: the variable is read once per process.

use gpumem::core::Stream;
use gpumem::host::Host;

#[test]
fn any_spelling_of_on_makes_the_per_thread_stream_the_default() {
    std::env::set_var(gpumem::core::PER_THREAD_DEFAULT_STREAM_ENV, " Yes ");
    assert!(Stream::<Host>::default_stream() == Stream::<Host>::per_thread());
    assert!(Stream::<Host>::default_stream() != Stream::<Host>::null());
    gpumem::core::SingleDeviceMemoryPool::<Host>::new(0).unwrap();
}
