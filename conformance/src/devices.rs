//! Devices: the current device per thread and per-device current streams.

/// The `devices` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __devices_tests {
    ($flavor:ident) => {
        mod devices {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::{Device, Error, Stream};


            conformance! {
                fn device_basics() {
                    let _serial = $crate::capture_lock();
                    let n = Device::count().unwrap();
                    assert!(n >= 1);
                    assert_eq!(Device::current().id(), 0, "a thread starts on device 0");
                    let props = Device::current().properties().unwrap();
                    assert!(props.total_memory > 0 && !props.name.is_empty());
                    let info = Device::current().mem_info().unwrap();
                    assert!(info.free <= info.total);
                    Device::current().synchronize().unwrap();
                    assert!(matches!(Device::new(n as i32).use_device(), Err(Error::NoSuchDevice { .. })));
                    assert!(matches!(Device::new(-1).enter(), Err(Error::NoSuchDevice { .. })));
                }

                fn each_device_has_its_own_current_stream() {
                    if Device::count().unwrap() < 2 {
                        // One device: the second cannot be entered.
                        assert!(Device::new(1).enter().is_err());
                        return;
                    }
                    let s0 = Stream::new().unwrap();
                    let _g = s0.enter().unwrap();
                    {
                        let _d = Device::new(1).enter().unwrap();
                        assert_eq!(Device::current().id(), 1);
                        assert_eq!(gpumem::get_current_stream(), Stream::null(), "device 1 is on its default stream");
                        assert_eq!(Stream::current_on(Some(0)), s0);
                        let err = s0.use_stream().unwrap_err();
                        assert_eq!(
                            err.to_string(),
                            "The device that the stream is created on (0) does not match with the current device (1)"
                        );
                        assert!(s0.enter().is_err());
                        let p = gpumem::alloc(64).unwrap();
                        assert_eq!(p.device_id(), 1);
                    }
                    assert_eq!(Device::current().id(), 0);
                    assert_eq!(gpumem::get_current_stream(), s0);

                    // A copy between the two devices (peer access enabled first, as CuPy).
                    let a = gpumem::alloc(4096).unwrap();
                    a.memset(0x5A, 4096).unwrap();
                    let b = {
                        let _d = Device::new(1).enter().unwrap();
                        gpumem::alloc(4096).unwrap()
                    };
                    b.copy_from_device(&a, 4096).unwrap();
                    assert_eq!($crate::read(&b, 4096), vec![0x5Au8; 4096]);
                    let device_of = |p: &gpumem::MemoryPointer| {
                        <gpumem::DefaultBackend as gpumem::core::DeviceOps>::pointer_device(p.ptr()).unwrap()
                    };
                    assert_eq!((device_of(&a), device_of(&b)), (Some(0), Some(1)));
                    // And back, asynchronously, on a stream of device 1.
                    let pattern: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
                    b.copy_from_host(&pattern, 4096).unwrap();
                    a.memset(0, 4096).unwrap();
                    {
                        let _d = Device::new(1).enter().unwrap();
                        let s1 = Stream::non_blocking().unwrap();
                        assert_eq!(s1.device_id(), Some(1));
                        a.copy_from_device_async(&b, 4096, Some(&s1)).unwrap();
                        s1.synchronize().unwrap();
                    }
                    assert_eq!($crate::read(&a, 4096), pattern);
                }
            }
        }
    };
}
