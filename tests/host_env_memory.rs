//! A malformed `GPUMEM_HOST_DEVICE_MEMORY` is an error naming the variable, the value and the
//! accepted forms, and a valid `GPUMEM_HOST_DEVICES` is used (its own test binary: the host
//! backend reads the variables once per process).

use gpumem::host::Host;

#[test]
fn a_malformed_device_memory_is_reported_and_a_valid_count_used() {
    std::env::set_var("GPUMEM_HOST_DEVICES", " 3 ");
    std::env::set_var("GPUMEM_HOST_DEVICE_MEMORY", "16 gigs");

    assert_eq!(gpumem::core::Device::<Host>::count().unwrap(), 3);
    let err = gpumem::core::Memory::<Host>::new_on(2, 1024).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, gpumem::Error::InvalidEnvironment { variable: "GPUMEM_HOST_DEVICE_MEMORY", .. }),
        "{err:?}"
    );
    assert!(
        text.contains("GPUMEM_HOST_DEVICE_MEMORY=\"16 gigs\"") && text.contains("a byte size, such as"),
        "{text}"
    );
    let err = gpumem::core::Device::<Host>::new(1).mem_info().unwrap_err();
    assert!(err.to_string().contains("GPUMEM_HOST_DEVICE_MEMORY"), "{err}");
}
