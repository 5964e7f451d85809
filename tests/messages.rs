//! What a user reads at the first edges: errors in words (`1 byte`, a host slice called one, host
//! operations named as such on the host backend), statistics before the first allocation, and
//! one spelling of "unlimited" and of the growth policies.

use gpumem::core::{Event, MemoryAsyncPool, MemoryPool};
use gpumem::host::Host;
use gpumem::{EventFlags, GrowthPolicy, Limit};

#[test]
fn byte_counts_and_host_slices_are_said_plainly() {
    let pool = MemoryPool::<Host>::new();
    let a = pool.malloc(1024).unwrap();
    let e = (&a + 1023).memset(0, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "out of bounds: memset of 2 bytes at offset 1023 of an allocation of 1,024 bytes"
    );
    let e = a.copy_from_host(&[1, 2, 3, 4], 8).unwrap_err();
    assert_eq!(e.to_string(), "out of bounds: copy_from_host source of 8 bytes from a host slice of 4 bytes");
    let mut out = [0u8; 1];
    let e = a.copy_to_host(&mut out, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "out of bounds: copy_to_host destination of 2 bytes from a host slice of 1 byte"
    );
}

#[test]
fn host_errors_name_host_operations() {
    // Two events never recorded: the host backend refuses to time them, as CUDA would.
    let start = Event::<Host>::with_flags(EventFlags::default()).unwrap();
    let end = Event::<Host>::with_flags(EventFlags::default()).unwrap();
    let e = gpumem::core::get_elapsed_time(&start, &end).unwrap_err().to_string();
    assert!(e.starts_with("event_elapsed_ms failed: HOST_ERROR_"), "{e}");
    assert!(!e.contains("cuEvent"), "{e}");
}

#[test]
fn statistics_exist_before_the_first_allocation() {
    let pool = MemoryPool::<Host>::new();
    let stats = pool.stats();
    assert_eq!((stats.all.allocated_bytes.current, stats.all.allocated_bytes.peak), (0, 0));
    assert_eq!(pool.memory_summary(), stats.to_string());
}

#[test]
fn unlimited_is_zero_everywhere() {
    let pool = MemoryPool::<Host>::new();
    assert_eq!(pool.get_limit().unwrap(), 0);
    let async_pool = MemoryAsyncPool::<Host>::new().unwrap();
    async_pool.set_limit(Limit::Bytes(0)).unwrap();
    assert_eq!(async_pool.get_limit().unwrap(), 0, "the stream-ordered pool says it the same way");
}

#[test]
fn growth_policies_have_one_spelling() {
    assert_eq!(GrowthPolicy::HoldPeakInUse.to_string(), "hold_peak_in_use");
    for spelling in ["hold_peak_in_use", "hold-peak-in-use", "HoldPeakInUse"] {
        assert_eq!(spelling.parse::<GrowthPolicy>().unwrap(), GrowthPolicy::HoldPeakInUse);
    }
}
