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
            }
        }
    };
}
