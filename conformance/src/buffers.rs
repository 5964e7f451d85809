//! Typed device buffers: `DeviceBuffer<T>` over the byte API.

/// The `buffers` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __buffers_tests {
    ($flavor:ident) => {
        mod buffers {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::{DeviceBuffer, Error, PinnedMemoryPointer, Stream, ALLOCATION_UNIT_SIZE};

            conformance! {
                fn round_trip_through_slices_and_vectors() {
                    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
                    let buf = DeviceBuffer::<f32>::from_slice(&data).unwrap();
                    assert_eq!(buf.len(), 1000);
                    assert!(!buf.is_empty());
                    assert_eq!(buf.size_in_bytes(), 4000);
                    assert_eq!(buf.to_vec().unwrap(), data);
                    let mut out = vec![0f32; 1000];
                    buf.copy_to_slice(&mut out).unwrap();
                    assert_eq!(out, data);
                    // The same bytes as the byte API sees them.
                    let bytes = $crate::read(buf.as_pointer(), 8);
                    assert_eq!(bytes, [0, 0, 0, 0, 0, 0, 0, 0x3f]);
                    let other: Vec<f32> = data.iter().map(|x| -x).collect();
                    buf.copy_from_slice(&other).unwrap();
                    assert_eq!(buf.to_vec().unwrap(), other);
                }

                fn lengths_must_match() {
                    let buf = DeviceBuffer::<u32>::zeros(10).unwrap();
                    assert!(matches!(buf.copy_from_slice(&[1, 2, 3]), Err(Error::InvalidArgument(_))));
                    let mut short = [0u32; 9];
                    assert!(matches!(buf.copy_to_slice(&mut short), Err(Error::InvalidArgument(_))));
                    let other = DeviceBuffer::<u32>::zeros(11).unwrap();
                    assert!(matches!(buf.copy_from_buffer(&other), Err(Error::InvalidArgument(_))));
                    assert_eq!(buf.to_vec().unwrap(), [0; 10], "nothing was written");
                }

                fn zeros_and_fill() {
                    // Dirty a chunk, free it, and take it again: `zeros` must clear it.
                    let dirty = gpumem::alloc(4096).unwrap();
                    dirty.memset(0xab, 4096).unwrap();
                    drop(dirty);
                    let z = DeviceBuffer::<u64>::zeros(512).unwrap();
                    assert!(z.to_vec().unwrap().iter().all(|&x| x == 0));

                    // A value with distinct bytes (doubled copies) and one with equal bytes
                    // (memset), for lengths that are and are not powers of two.
                    for len in [0usize, 1, 2, 3, 7, 64, 1000] {
                        let b = DeviceBuffer::<u32>::zeros(len).unwrap();
                        b.fill(0x1234_5678).unwrap();
                        assert_eq!(b.to_vec().unwrap(), vec![0x1234_5678; len], "len {len}");
                        b.fill(u32::MAX).unwrap();
                        assert_eq!(b.to_vec().unwrap(), vec![u32::MAX; len], "len {len}");
                    }
                    let e = DeviceBuffer::<f64>::from_elem(2.5, 33).unwrap();
                    assert_eq!(e.to_vec().unwrap(), vec![2.5; 33]);
                }

                fn fill_stops_at_the_length_not_the_chunk() {
                    // 3 elements of a chunk rounded up to the pool's unit: the bytes after them
                    // stay as they were.
                    let p = gpumem::alloc(12).unwrap();
                    assert!(p.mem().size() >= ALLOCATION_UNIT_SIZE);
                    p.memset(0x11, ALLOCATION_UNIT_SIZE).unwrap();
                    let b = DeviceBuffer::<u32>::from_pointer(p.clone(), 3).unwrap();
                    b.fill(0xdead_beef).unwrap();
                    let bytes = $crate::read(&p, 16);
                    assert_eq!(&bytes[..12], &[0xef, 0xbe, 0xad, 0xde].repeat(3)[..]);
                    assert_eq!(&bytes[12..], &[0x11; 4]);
                }

                fn slices_are_checked_against_the_requested_length() {
                    let data: Vec<u16> = (0..100).collect();
                    let buf = DeviceBuffer::<u16>::from_slice(&data).unwrap();
                    // The chunk holds 256 elements; the buffer has 100.
                    assert!(buf.as_pointer().size() >= 512);
                    let mid = buf.slice(10..20).unwrap();
                    assert_eq!(mid.len(), 10);
                    assert_eq!(mid.device_ptr(), buf.device_ptr() + 20);
                    assert_eq!(mid.to_vec().unwrap(), (10..20).collect::<Vec<u16>>());
                    assert_eq!(buf.slice(..).unwrap().len(), 100);
                    assert_eq!(buf.slice(100..).unwrap().len(), 0);
                    assert_eq!(buf.slice(..=99).unwrap().len(), 100);
                    for bad in [buf.slice(0..101), buf.slice(99..=100), buf.slice(101..), buf.slice((std::ops::Bound::Included(50), std::ops::Bound::Excluded(40)))] {
                        assert!(matches!(bad, Err(Error::OutOfBounds { .. })), "{bad:?}");
                    }
                    // A slice of a slice is checked against its own length.
                    assert!(matches!(mid.slice(5..11), Err(Error::OutOfBounds { .. })));
                    // Writes through a view land in the parent.
                    mid.fill(7).unwrap();
                    let back = buf.to_vec().unwrap();
                    assert_eq!(&back[10..20], &[7; 10]);
                    assert_eq!(&back[..10], &data[..10]);
                    assert_eq!(&back[20..], &data[20..]);
                }

                fn device_copies_clones_and_overlap() {
                    let a = DeviceBuffer::<i32>::from_slice(&[1, 2, 3, 4, 5, 6]).unwrap();
                    let b = a.try_clone().unwrap();
                    assert_ne!(a.device_ptr(), b.device_ptr());
                    a.fill(0).unwrap();
                    assert_eq!(b.to_vec().unwrap(), [1, 2, 3, 4, 5, 6]);
                    a.copy_from_buffer(&b).unwrap();
                    assert_eq!(a.to_vec().unwrap(), [1, 2, 3, 4, 5, 6]);
                    let shared = a.clone();
                    assert_eq!(shared.device_ptr(), a.device_ptr());
                    assert!(matches!(
                        a.slice(0..3).unwrap().copy_from_buffer(&a.slice(2..5).unwrap()),
                        Err(Error::Overlap { .. })
                    ));
                }

                fn from_pointer_checks_size_and_alignment() {
                    let p = gpumem::alloc(64).unwrap();
                    let size = p.mem().size();
                    assert!(DeviceBuffer::<u64>::from_pointer(p.clone(), size / 8).is_ok());
                    assert!(matches!(
                        DeviceBuffer::<u64>::from_pointer(p.clone(), size / 8 + 1),
                        Err(Error::OutOfBounds { .. })
                    ));
                    assert!(matches!(
                        DeviceBuffer::<u64>::from_pointer(&p + 4, 1),
                        Err(Error::InvalidArgument(_))
                    ));
                    assert!(matches!(
                        DeviceBuffer::<u64>::from_pointer(p.clone(), usize::MAX / 4),
                        Err(Error::InvalidArgument(_))
                    ));
                    assert!(DeviceBuffer::<u8>::zeros(usize::MAX).is_err());
                }

                fn async_forms_on_a_stream() {
                    let s = Stream::non_blocking().unwrap();
                    let data: Vec<u32> = (0..50_000).collect();
                    let buf = DeviceBuffer::<u32>::from_slice_async(&data, Some(&s)).unwrap();
                    let copy = DeviceBuffer::<u32>::zeros(data.len()).unwrap();
                    copy.copy_from_buffer_async(&buf, Some(&s)).unwrap();
                    copy.slice(..10).unwrap().fill_async(0x0102_0304, Some(&s)).unwrap();
                    copy.slice(10..20).unwrap().fill_async(0, Some(&s)).unwrap();
                    let out = PinnedMemoryPointer::alloc(copy.size_in_bytes()).unwrap();
                    copy.copy_to_pinned_async(&out, Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    let mut back = vec![0u32; data.len()];
                    DeviceBuffer::<u32>::read_pinned(&out, &mut back).unwrap();
                    assert_eq!(&back[..10], &[0x0102_0304; 10]);
                    assert_eq!(&back[10..20], &[0; 10]);
                    assert_eq!(&back[20..], &data[20..]);
                    // Host data in, from pinned memory gpumem does not own.
                    let src = PinnedMemoryPointer::alloc(copy.size_in_bytes()).unwrap();
                    src.write(&vec![0xffu8; copy.size_in_bytes()]).unwrap();
                    copy.copy_from_pinned_async(&src, Some(&s)).unwrap();
                    drop(src);
                    s.synchronize().unwrap();
                    assert!(copy.to_vec().unwrap().iter().all(|&x| x == u32::MAX));
                    let small = PinnedMemoryPointer::alloc(4).unwrap();
                    assert!(matches!(copy.copy_from_pinned_async(&small, Some(&s)), Err(Error::OutOfBounds { .. })));
                }

                fn staged_async_forms_refuse_capture() {
                    if !super::supports_capture() {
                        return;
                    }
                    let _lock = $crate::capture_lock();
                    let s = Stream::non_blocking().unwrap();
                    let buf = DeviceBuffer::<u32>::zeros(16).unwrap();
                    s.begin_capture(None).unwrap();
                    // Staged through pinned memory: a host transfer, which capture refuses.
                    let staged = buf.copy_from_slice_async(&[1; 16], Some(&s));
                    let staged_fill = buf.fill_async(0x0102_0304, Some(&s));
                    // One memset: captured.
                    let memset = buf.fill_async(0x0505_0505, Some(&s));
                    let graph = s.end_capture().unwrap();
                    assert!(matches!(staged, Err(Error::NotAllowedWhileCapturing(_))), "{staged:?}");
                    assert!(matches!(staged_fill, Err(Error::NotAllowedWhileCapturing(_))), "{staged_fill:?}");
                    memset.unwrap();
                    assert_eq!(buf.to_vec().unwrap(), [0; 16], "captured, not run");
                    graph.launch(Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(buf.to_vec().unwrap(), [0x0505_0505; 16]);
                }
            }
        }
    };
}
