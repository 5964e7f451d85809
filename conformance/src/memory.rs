//! MemoryPointer: offsets, copies and memsets, and the bounds checks CuPy does not make.

/// The `memory` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __memory_tests {
    ($flavor:ident) => {
        mod memory {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::Arc;

            use gpumem::{BaseMemory, CopySource, Error, Memory, MemoryPointer, Stream, UnownedMemory};

            use $crate::read;

            fn memory(size: usize) -> MemoryPointer {
                MemoryPointer::from_memory(Memory::new(size).unwrap())
            }

            conformance! {
                fn pointer_arithmetic_follows_cupy() {
                    let p = memory(1024);
                    let base = p.ptr();
                    assert_eq!((&p + 4).ptr(), base + 4);
                    assert_eq!((4 + &p).ptr(), base + 4);
                    assert_eq!((&(&p + 8) - 4).ptr(), base + 4);
                    let mut q = p.clone();
                    q += 10;
                    assert_eq!((q.ptr(), q.offset(), q.size()), (base + 10, 10, 1014));
                    q -= 3;
                    assert_eq!(q.offset(), 7);
                    assert_eq!(p.offset(), 0, "+= changes only the pointer it is applied to");
                    assert!(Arc::ptr_eq(q.mem(), p.mem()), "offset pointers share their memory");
                    assert_eq!(p.device_id(), gpumem::Device::current().id());
                    assert!(format!("{p:?}").starts_with("<MemoryPointer 0x"));
                }

                fn offsets_outside_the_memory_are_refused() {
                    let p = memory(512);
                    assert!(p.checked_add(512).is_ok(), "one past the end is a valid pointer");
                    assert!(matches!(p.checked_add(513), Err(Error::OutOfBounds { .. })));
                    assert!(matches!(p.checked_add(-1), Err(Error::OutOfBounds { .. })));
                    assert!(MemoryPointer::new(p.mem().clone(), 600).is_err());
                    let outside = &p - 8;
                    assert_eq!(outside.size(), 0);
                    assert!(matches!(outside.memset(0, 1), Err(Error::OutOfBounds { offset: -8, .. })));
                }

                fn round_trip_through_host_and_device() {
                    let value: i32 = 0x1234_5678;
                    let a = memory(4);
                    a.copy_from_host(&value.to_ne_bytes(), 4).unwrap();
                    let b = memory(4);
                    b.copy_from_device(&a, 4).unwrap();
                    let mut out = [0u8; 4];
                    b.copy_to_host(&mut out, 4).unwrap();
                    assert_eq!(i32::from_ne_bytes(out), value);
                    // copy_from picks the right form from its source.
                    let c = memory(4);
                    c.copy_from(&b, 4).unwrap();
                    assert_eq!(read(&c, 4), value.to_ne_bytes());
                    c.copy_from(&[9u8, 8, 7, 6], 4).unwrap();
                    assert_eq!(read(&c, 4), [9, 8, 7, 6]);
                    // Raw host addresses, as CuPy's int/ctypes forms.
                    let d = memory(4);
                    let src = [1u8, 2, 3, 4];
                    // SAFETY: `src` is readable for 4 bytes during the call.
                    unsafe { d.copy_from_host_ptr(src.as_ptr(), 4).unwrap() };
                    let mut dst = [0u8; 4];
                    // SAFETY: `dst` is writable for 4 bytes during the call.
                    unsafe { d.copy_to_host_ptr(dst.as_mut_ptr(), 4).unwrap() };
                    assert_eq!(dst, src);
                }

                fn async_copies_on_a_given_stream_and_on_the_current_one() {
                    for stream in [Some(Stream::new().unwrap()), None] {
                        let a = memory(256);
                        a.copy_from_host(&[5u8; 256], 256).unwrap();
                        let b = memory(256);
                        b.copy_from_device_async(&a, 256, stream.as_ref()).unwrap();
                        (&b + 128).memset_async(6, 128, stream.as_ref()).unwrap();
                        stream.clone().unwrap_or_else(gpumem::get_current_stream).synchronize().unwrap();
                        let back = read(&b, 256);
                        assert!(back[..128].iter().all(|&x| x == 5) && back[128..].iter().all(|&x| x == 6));
                        assert!(matches!(b.copy_from_async(&[0u8; 4], 4, stream.as_ref()), Err(Error::InvalidArgument(_))));
                        b.copy_from_async(CopySource::Device(&a), 4, stream.as_ref()).unwrap();
                    }
                }

                fn memset_reads_back_byte_by_byte() {
                    let p = memory(4);
                    p.memset(0, 4).unwrap();
                    p.memset(1, 4).unwrap();
                    let mut q = p.clone();
                    while q.offset() < 4 {
                        let mut b = [0u8; 1];
                        q.copy_to_host(&mut b, 1).unwrap();
                        assert_eq!(b, [1]);
                        q += 1;
                    }
                }

                fn every_out_of_range_copy_is_refused_and_leaves_memory_untouched() {
                    let a = memory(512);
                    let b = memory(512);
                    a.memset(0xAA, 512).unwrap();
                    b.memset(0xBB, 512).unwrap();
                    let s = Stream::new().unwrap();
                    let tail = &a + 500;
                    let mut host = vec![0u8; 64];
                    let results: Vec<(&str, gpumem::Result<()>)> = vec![
                        ("memset", tail.memset(1, 13)),
                        ("memset_async", tail.memset_async(1, 13, Some(&s))),
                        ("copy_from_host", tail.copy_from_host(&[1u8; 13], 13)),
                        ("copy_from_host short source", a.copy_from_host(&[1u8; 4], 5)),
                        ("copy_to_host", tail.copy_to_host(&mut host, 13)),
                        ("copy_to_host short destination", a.copy_to_host(&mut host, 65)),
                        ("copy_from_device destination", tail.copy_from_device(&b, 13)),
                        ("copy_from_device source", a.copy_from_device(&(&b + 500), 13)),
                        ("copy_from_device_async", tail.copy_from_device_async(&b, 13, Some(&s))),
                        ("negative offset", (&a - 1).memset(1, 1)),
                        ("huge size", a.memset(1, usize::MAX)),
                        ("overlap", a.copy_from_device(&(&a + 8), 16)),
                    ];
                    s.synchronize().unwrap();
                    for (what, r) in results {
                        assert!(matches!(r, Err(Error::OutOfBounds { .. } | Error::Overlap { .. })), "{what}: {r:?}");
                    }
                    assert!(read(&a, 512).iter().all(|&x| x == 0xAA), "nothing was written to a");
                    assert!(read(&b, 512).iter().all(|&x| x == 0xBB), "nothing was written to b");
                    assert!(host.iter().all(|&x| x == 0), "nothing was written to the host buffer");
                    // The last byte, and zero bytes at the very end, are in range.
                    (&a + 511).memset(1, 1).unwrap();
                    (&a + 512).memset(1, 0).unwrap();
                }

                fn zero_size_memory_and_copies() {
                    let m = Memory::new(0).unwrap();
                    assert_eq!((m.ptr(), m.size()), (0, 0));
                    let p = MemoryPointer::from_memory(m);
                    p.memset(0, 0).unwrap();
                    p.copy_from_host(&[], 0).unwrap();
                    assert!(p.memset(0, 1).is_err());
                }

                fn unowned_memory_keeps_its_owner_and_finds_its_device() {
                    let owner = Arc::new(memory(256));
                    owner.memset(3, 256).unwrap();
                    // SAFETY: the range is device memory kept alive by `owner`, which the wrapper holds.
                    let un = unsafe { UnownedMemory::new(owner.ptr() + 16, 64, Some(owner.clone()), None) }.unwrap();
                    assert_eq!((un.size(), un.device_id()), (64, owner.device_id()));
                    let p = MemoryPointer::from_memory(un);
                    drop(owner);
                    assert_eq!(read(&p, 64), vec![3u8; 64], "usable after the source pointer is gone");
                    // SAFETY: a null pointer of size 0 is never accessed.
                    let null = unsafe { UnownedMemory::new(0, 0, None, None) };
                    assert_eq!(
                        null.unwrap_err().to_string(),
                        "invalid argument: UnownedMemory requires explicit device ID for a null pointer."
                    );
                }
            }
        }
    };
}
