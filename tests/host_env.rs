//! A malformed `GPUMEM_HOST_DEVICES` is an error naming the variable, the value and the accepted
//! forms (its own test binary: the host backend reads the variables once per process;
//! `host_env_memory.rs` covers `GPUMEM_HOST_DEVICE_MEMORY`).

use gpumem::host::Host;

#[test]
fn a_malformed_device_count_is_reported_everywhere() {
    std::env::set_var("GPUMEM_HOST_DEVICES", "two");

    let err = gpumem::core::Device::<Host>::count().unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, gpumem::Error::InvalidEnvironment { variable: "GPUMEM_HOST_DEVICES", .. }),
        "{err:?}"
    );
    assert!(
        text.contains("GPUMEM_HOST_DEVICES=\"two\"") && text.contains("an integer from 1 to 64"),
        "{text}"
    );

    // Every later call reports it too, not only the first.
    for _ in 0..2 {
        let err = gpumem::core::Memory::<Host>::new_on(0, 1024).unwrap_err();
        assert!(err.to_string().contains("GPUMEM_HOST_DEVICES=\"two\""), "{err}");
    }
    let err = gpumem::core::Device::<Host>::new(0).mem_info().unwrap_err();
    assert!(err.to_string().contains("GPUMEM_HOST_DEVICES"), "{err}");
}
