//! Requests no device could serve are refused as bad arguments, not as out of memory (an
//! out-of-memory retry loop would retry them), and device ids that do not exist are
//! `NoSuchDevice` with one text.

use gpumem_core::host::Host;
use gpumem_core::{
    Device, Error, MemoryAsyncPool, MemoryOps, MemoryPool, SingleDeviceMemoryPool, MAX_ALLOCATION_SIZE,
};

fn assert_too_large(result: gpumem_core::Result<impl std::fmt::Debug>, size: usize) {
    match result {
        Err(e @ Error::InvalidArgument(_)) => {
            assert!(!e.is_out_of_memory());
            assert!(e.to_string().contains(&format!("cannot allocate {size} bytes")), "{e}");
        }
        other => panic!("{size} bytes gave {other:?}"),
    }
}

#[test]
fn sizes_no_allocation_can_have_are_invalid_arguments() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    for size in [usize::MAX, usize::MAX - 500, MAX_ALLOCATION_SIZE + 1] {
        assert_too_large(gpumem_core::alloc::<Host>(size), size);
        assert_too_large(pool.malloc(size), size);
        assert_too_large(pool.malloc_pooled(size), size);
        assert_too_large(MemoryPool::<Host>::new().malloc(size), size);
        assert_too_large(Host::malloc(0, size), size);
    }
    if let Ok(async_pool) = MemoryAsyncPool::<Host>::new() {
        assert_too_large(async_pool.malloc(usize::MAX), usize::MAX);
    }
    // A size that could exist is still an out-of-memory when the device has too little.
    assert!(pool.malloc(MAX_ALLOCATION_SIZE - 511).unwrap_err().is_out_of_memory());
}

#[test]
fn device_ids_that_do_not_exist_are_no_such_device_everywhere() {
    let count = Device::<Host>::count().unwrap();
    let text = |id: i32| format!("device {id} does not exist ({count} device(s) on the host backend)");
    for id in [count as i32, 99, -1, i32::MIN] {
        let errors = [
            Device::<Host>::new(id).use_device().unwrap_err(),
            Device::<Host>::new(id).enter().err().unwrap(),
            MemoryPool::<Host>::new().device_pool(id).unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, Error::NoSuchDevice { device, .. } if device == id), "{e:?}");
            assert_eq!(e.to_string(), text(id));
        }
    }
}
