//! Virtual memory (the contract's `VirtualMemoryOps`): a reserved range grows by mapping
//! granules at its end and shrinks by unmapping them; backends without it say so.

/// The `vmm` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __vmm_tests {
    ($flavor:ident) => {
        mod vmm {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::core::{Api, MemoryOps, VirtualMemoryOps};
            use gpumem::{DefaultBackend as B, Error};

            fn read(dev: gpumem::core::DeviceId, ptr: usize, n: usize) -> Vec<u8> {
                let mut out = vec![0u8; n];
                // SAFETY: the callers pass mapped, accessible device ranges of `n` bytes; `out`
                // is `n` writable host bytes.
                unsafe { B::memcpy(dev, out.as_mut_ptr() as usize, ptr, n).unwrap() };
                out
            }

            conformance! {
                fn a_reserved_range_grows_and_shrinks_by_granules() {
                    let dev = gpumem::Device::current().id();
                    if !<B as Api>::CAPS.virtual_memory {
                        let e = B::vm_reserve(dev, 2 << 20).unwrap_err();
                        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
                        return;
                    }
                    let g = B::vm_granularity(dev).unwrap();
                    assert!(g.is_power_of_two() && g >= 4096, "granule {g}");
                    let base = B::vm_reserve(dev, 4 * g).unwrap();
                    assert_eq!(base % g, 0, "the range is aligned to the granule");
                    let first = B::vm_create(dev, g).unwrap();
                    let second = B::vm_create(dev, g).unwrap();
                    // SAFETY: each range below lies in the reserved range, and is mapped (then
                    // made accessible) before it is touched; nothing is pending when unmapped.
                    unsafe {
                        B::vm_map(dev, base, g, first).unwrap();
                        B::vm_set_access(dev, base, g, &[dev]).unwrap();
                        B::memset(dev, base, 7, g).unwrap();
                        assert_eq!(read(dev, base + g - 16, 16), vec![7; 16]);
                        // Grow: the next granule, mapped at the end, continues the same range.
                        B::vm_map(dev, base + g, g, second).unwrap();
                        B::vm_set_access(dev, base + g, g, &[dev]).unwrap();
                        B::memset(dev, base + g - 8, 9, 16).unwrap();
                        let across = read(dev, base + g - 12, 20);
                        assert_eq!(across, [vec![7; 4], vec![9; 16]].concat(), "one memset across both granules");
                        assert_eq!(read(dev, base, 8), vec![7; 8], "the first granule kept its bytes");
                        // Shrink: the tail goes, the head stays.
                        B::vm_unmap(dev, base + g, g).unwrap();
                        B::vm_release(dev, second).unwrap();
                        assert_eq!(read(dev, base + g - 4, 4), vec![9; 4]);
                        // Unaligned mappings and sizes are refused.
                        let odd = B::vm_create(dev, g).unwrap();
                        assert!(B::vm_map(dev, base + g + 512, g, odd).is_err(), "an unaligned address");
                        B::vm_release(dev, odd).unwrap();
                        B::vm_unmap(dev, base, g).unwrap();
                        B::vm_release(dev, first).unwrap();
                        B::vm_free_range(dev, base, 4 * g).unwrap();
                    }
                    assert!(B::vm_create(dev, g + 1).is_err(), "a size that is not whole granules");
                }

                fn a_stitching_pool_moves_pages_from_under_holes_and_live_memory_keeps_its_bytes() {
                    use gpumem::core::SingleDeviceMemoryPool;
                    const MIB: usize = 1 << 20;
                    let dev = gpumem::Device::current().id();
                    if !<B as Api>::CAPS.virtual_memory {
                        let e = SingleDeviceMemoryPool::<B>::with_stitching(dev).unwrap_err();
                        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
                        return;
                    }
                    let pool = SingleDeviceMemoryPool::<B>::with_stitching(dev).unwrap();
                    let stream = gpumem::Stream::non_blocking().unwrap();
                    let _on = stream.enter().unwrap();
                    let bytes_at = |p: &gpumem::MemoryPointer, at: usize| {
                        let mut out = [0u8; 16];
                        (p + at as isize).copy_to_host(&mut out, 16).unwrap();
                        out
                    };
                    let mut chunks: Vec<Option<gpumem::MemoryPointer>> = (0..8u8)
                        .map(|i| {
                            let p = pool.malloc(4 * MIB).unwrap();
                            p.memset(i + 1, 4 * MIB).unwrap();
                            Some(p)
                        })
                        .collect();
                    let held = pool.pool().total_bytes();
                    // A hole whose last use is still queued: the pages under it move only after it.
                    let slow = gpumem::Stream::non_blocking().unwrap();
                    slow.launch_host_func(|| std::thread::sleep(std::time::Duration::from_millis(200))).unwrap();
                    let gate = gpumem::Event::new().unwrap();
                    gate.record(Some(&slow)).unwrap();
                    stream.wait_event(&gate).unwrap();
                    chunks[3].as_ref().unwrap().memset_async(0xee, 4 * MIB, Some(&stream)).unwrap();
                    for i in [1, 3, 5] {
                        chunks[i] = None;
                    }
                    // Three 4 MiB holes, apart: 12 MiB fits none, so their pages move.
                    let big = pool.malloc(12 * MIB).unwrap();
                    big.memset(0xab, 12 * MIB).unwrap();
                    assert_eq!(pool.pool().total_bytes(), held, "the holes' pages were moved, none made");
                    for i in [0usize, 2, 4, 6, 7] {
                        let p = chunks[i].as_ref().unwrap();
                        let want = [i as u8 + 1; 16];
                        assert_eq!((bytes_at(p, 0), bytes_at(p, 4 * MIB - 16)), (want, want), "chunk {i}");
                    }
                    assert_eq!((bytes_at(&big, 0), bytes_at(&big, 12 * MIB - 16)), ([0xab; 16], [0xab; 16]));
                    drop((chunks, big));
                    stream.synchronize().unwrap();
                    pool.free_all_blocks(None);
                    assert_eq!(pool.pool().total_bytes(), 0, "every page went back");
                }
            }
        }
    };
}
