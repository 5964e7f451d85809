//! The pool on the real backend: reuse, statistics, limits, streams, and out-of-memory.

/// The `pool` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __pool_tests {
    ($flavor:ident) => {
        mod pool {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::{Error, Limit, MemoryPool, Stream};


            const U: usize = gpumem::ALLOCATION_UNIT_SIZE;

            conformance! {
                fn the_pool_reuses_freed_memory() {
                    let pool = MemoryPool::new();
                    let p = pool.malloc(3 * U).unwrap();
                    let ptr = p.ptr();
                    assert_eq!(p.mem().identity(), "PooledMemory");
                    drop(p);
                    let q = pool.malloc(3 * U - 7).unwrap();
                    assert_eq!(q.ptr(), ptr);
                    assert_eq!((pool.used_bytes(), pool.total_bytes(), pool.n_free_blocks()), (3 * U, 3 * U, 0));
                    drop(q);
                    pool.free_all_blocks(None);
                    assert_eq!(pool.total_bytes(), 0);
                }

                fn pooled_memory_is_usable_memory() {
                    let pool = MemoryPool::new();
                    let s = Stream::non_blocking().unwrap();
                    let _g = s.enter().unwrap();
                    let chunks: Vec<_> = (0..32u8).map(|i| {
                        let p = pool.malloc(1000 + i as usize * 100).unwrap();
                        p.memset_async(i, 1000, None).unwrap();
                        p
                    }).collect();
                    s.synchronize().unwrap();
                    for (i, p) in chunks.iter().enumerate() {
                        assert!($crate::read(p, 1000).iter().all(|&b| b == i as u8));
                    }
                }

                fn the_limit_bounds_bytes_held_and_gives_cupys_message() {
                    let pool = MemoryPool::new();
                    pool.set_limit(Limit::Bytes(4 * U)).unwrap();
                    let _a = pool.malloc(3 * U).unwrap();
                    let err = pool.malloc(2 * U).unwrap_err();
                    assert_eq!(
                        err.to_string(),
                        "Out of memory allocating 1,024 bytes (allocated so far: 1,536 bytes, limit set to: 2,048 bytes)."
                    );
                    assert!(err.is_out_of_memory());
                    pool.set_limit(Limit::Fraction(1.0)).unwrap();
                    assert_eq!(pool.get_limit().unwrap(), gpumem::Device::current().mem_info().unwrap().total);
                }

                fn an_impossible_allocation_is_out_of_memory_not_a_crash() {
                    let pool = MemoryPool::new();
                    let total = gpumem::Device::current().mem_info().unwrap().total;
                    let err = pool.malloc(total * 4).unwrap_err();
                    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
                    assert_eq!(pool.total_bytes(), 0, "nothing is held after the failure");
                    // The runtime's own allocation too: out of memory, with the size asked for.
                    match gpumem::Memory::new(total * 4) {
                        Err(Error::OutOfMemory { size, total: None }) => assert_eq!(size, total * 4),
                        other => panic!("expected OutOfMemory from the runtime, got {other:?}"),
                    }
                    let p = pool.malloc(U).unwrap();
                    p.memset(3, U).unwrap();
                    assert_eq!($crate::read(&p, U), vec![3u8; U], "the device stays usable");
                }

                fn a_pool_pointer_names_its_chunk() {
                    struct Ids(std::cell::RefCell<Vec<u64>>);
                    impl gpumem::core::MemoryHook for Ids {
                        fn name(&self) -> &str {
                            "conformance::Ids"
                        }
                        fn malloc_postprocess(&self, e: &gpumem::core::MallocEvent) -> gpumem::core::HookResult {
                            self.0.borrow_mut().push(e.pmem_id);
                            Ok(())
                        }
                    }
                    let pool = MemoryPool::new();
                    let ids = gpumem::core::hooks::install(Ids(std::cell::RefCell::new(Vec::new()))).unwrap();
                    let a = pool.malloc(U).unwrap();
                    let b = pool.malloc(U).unwrap();
                    let (ia, ib) = (a.pmem_id().unwrap(), b.pmem_id().unwrap());
                    assert_ne!(ia, ib, "two live chunks have two ids");
                    assert_eq!(*ids.0.borrow(), vec![ia, ib], "the id the hooks report");
                    assert_eq!((&a + 10).pmem_id(), Some(ia), "an offset pointer names the same chunk");
                    assert_eq!(a.clone().pmem_id(), Some(ia));
                    drop(ids);
                    assert_eq!(pool.malloc(0).unwrap().pmem_id(), None, "size 0 is not a chunk");
                    let raw = gpumem::MemoryPointer::from_memory(gpumem::Memory::new(U).unwrap());
                    assert_eq!(raw.pmem_id(), None, "raw memory is not a chunk");
                }
            }
        }
    };
}
